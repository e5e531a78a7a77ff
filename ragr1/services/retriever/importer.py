"""``ragr1 index import``: an index built elsewhere (Search-R1, RAG-R1, FlashRAG) as N shards, no embedding.

The source is one FAISS file or an ordered list of part files whose rows continue one another
(row ``i`` of the whole is line ``i`` of the corpus). It is split by contiguous row ranges, the same
ranges ``ragr1 index build`` uses, and each shard is written before the next is read:

- flat (inner product or L2): the vectors are copied chunk by chunk from the source into the shard
  file, so the memory an import needs is one chunk (``chunk_rows`` x dim x 4 bytes), whatever the
  size of the index or of a shard;
- IVF-flat and IVF-PQ: each shard is an IVF index with the source's trained quantizer (and codebooks)
  holding its rows' entries of every inverted list, copied compressed (``ivf_file``); memory is one
  shard's compressed size;
- HNSW-flat: a graph cannot be cut into sub-graphs, so each shard's graph is rebuilt by adding its
  rows' stored vectors to a new HNSW index with the source's M and efConstruction (no embedding, but
  graph construction: one shard's vectors and graph in memory, and the CPU time of an HNSW build).

The corpus becomes a passage store (``<out>/store``) unless one is given; its passage count must be
the index's row count. The manifest records the declared query encoder, so the router embeds queries
as the index was built, and the source's metric, so an L2 index's shards merge smallest first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ragr1.services.retriever.build import encoder_export
from ragr1.services.retriever.corpus import KILT_WORDS_PER_PASSAGE, PassageStore, read_corpus, write_store
from ragr1.services.retriever.encoder import EncoderSettings
from ragr1.services.retriever.faiss_file import SourceParts, write_flat
from ragr1.services.retriever.index import IndexSpec
from ragr1.services.retriever.ivf_file import write_ivf_shard
from ragr1.services.retriever.manifest import Manifest, shard_entry, shard_file, shard_ranges

DEFAULT_CHUNK_ROWS = 32768
IMPORT_FILE = "import.json"
STORE_DIR = "store"


class CountMismatch(ValueError):
    """The index and the corpus do not hold the same number of rows."""


def check_counts(parts: SourceParts, num_passages: int, corpus: str) -> None:
    if parts.ntotal != num_passages:
        files = ", ".join(str(p.path) for p in parts.parts)
        raise CountMismatch(
            f"the index ({files}) holds {parts.ntotal} vectors, the corpus ({corpus}) {num_passages} passages: "
            "row i of the index must be passage i of the corpus"
        )


def _write_shard(parts: SourceParts, path: Path, start: int, end: int, chunk_rows: int) -> None:
    import faiss

    first = parts.first
    tmp = path.with_name(path.name + ".tmp")
    if first.kind.startswith("ivf"):
        write_ivf_shard(parts.ivf_parts(start, end), tmp, start, end)
    elif first.kind == "flat":
        write_flat(tmp, first.dim, first.metric, end - start, parts.chunks(start, end, chunk_rows))
    else:
        metric = faiss.METRIC_INNER_PRODUCT if first.metric == "ip" else faiss.METRIC_L2
        index = faiss.IndexHNSWFlat(first.dim, first.hnsw_m, metric)
        index.hnsw.efConstruction = first.ef_construction
        # Added in one call: FAISS builds the graph levels in parallel only within one add.
        index.add(np.concatenate(list(parts.chunks(start, end, chunk_rows))))
        faiss.write_index(index, str(tmp))
    os.replace(tmp, path)


def import_index(
    sources: Sequence[Path],
    out_dir: Path,
    settings: EncoderSettings,
    *,
    num_shards: int = 1,
    store: PassageStore | None = None,
    corpus: Sequence[Path] = (),
    corpus_format: str = "jsonl",
    words: int = KILT_WORDS_PER_PASSAGE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ef_search: int = 0,
    nprobe: int = 0,
    progress: bool = True,
) -> Path:
    """Writes ``num_shards`` shards of ``sources``, the store (unless given) and the manifest; returns
    the manifest's path. ``ef_search`` 0 keeps an HNSW source's own, ``nprobe`` 0 an IVF source's."""
    started = time.perf_counter()
    parts = SourceParts([Path(s) for s in sources])
    first = parts.first
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if store is None:
        if not corpus:
            raise ValueError("give the corpus (JSONL or KILT files) or a passage store")
        store = write_store(read_corpus(corpus, corpus_format, words), out_dir / STORE_DIR, progress=progress)
        described = ", ".join(str(c) for c in corpus)
    else:
        described = str(store.directory)
    check_counts(parts, len(store), described)
    export = encoder_export(settings, out_dir)
    spec = IndexSpec(
        first.kind,
        hnsw_m=first.hnsw_m or IndexSpec.hnsw_m,
        ef_search=ef_search or first.ef_search or IndexSpec.ef_search,
        nlist=first.nlist or IndexSpec.nlist,
        nprobe=nprobe or first.nprobe or IndexSpec.nprobe,
        metric=first.metric,
    )
    entries = []
    ranges = shard_ranges(parts.ntotal, num_shards)
    for shard, (start, end) in enumerate(tqdm(ranges, desc="import", unit=" shards", disable=not progress)):
        name = shard_file(shard, num_shards, spec.index_type)
        _write_shard(parts, out_dir / name, start, end, chunk_rows)
        entries.append(shard_entry(out_dir, name, start, end))
    manifest = Manifest.over_store(
        out_dir, encoder=settings, dim=first.dim, index=spec, store=store, shards=entries, encoder_export=export
    )
    provenance = {
        "sources": [
            {"file": str(p.path.resolve()), "bytes": p.path.stat().st_size, "vectors": p.ntotal, "kind": p.kind}
            for p in parts.parts
        ],
        "corpus": described,
        "metric": first.metric,
        "encoder": dataclasses.asdict(settings),
        "seconds": round(time.perf_counter() - started, 3),
    }
    (out_dir / IMPORT_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    return manifest.save(out_dir)
