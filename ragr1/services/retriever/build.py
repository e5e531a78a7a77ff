"""Index build: embed the passage store in resumable chunks, then one FAISS index per shard.

Embeddings go to ``<embeddings_dir>/<start>-<end>.npy``, each written under a temporary name and
renamed when complete, so a crashed or interrupted build reruns only the chunks it had not finished.
The chunk directory is keyed by the store's checksum and the encoder settings (by default under
``RAGR1_CACHE_DIR/embeddings/``, checked against ``embeddings.json``): a rerun with other settings
cannot mix vectors, and rebuilding with another shard count or index type re-embeds nothing. The
manifest is written last: an index without one is unfinished and no shard serves it. With an ONNX
encoder backend the export goes into ``<out>/encoder/`` first, and the manifest names it (and its
checksum) so that the router encodes queries with exactly the network that embedded the passages.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.encoder import Encoder, EncoderSettings, copy_export, ensure_export
from ragr1.services.retriever.manifest import EncoderExport, Manifest, shard_entry, shard_file, shard_ranges
from ragr1.shipped import cache_dir, cache_lock

EMBEDDINGS_META = "embeddings.json"
DEFAULT_CHUNK_SIZE = 1024
ENCODER_DIR = "encoder"


def encoder_export(settings: EncoderSettings, out_dir: Path) -> EncoderExport | None:
    """The ONNX export copied beside the index (None for torch, which loads the model by name), so that
    the router encodes queries with exactly the network the manifest names."""
    if settings.backend == "torch":
        return None
    return EncoderExport(ENCODER_DIR, copy_export(ensure_export(settings), Path(out_dir) / ENCODER_DIR))


def embeddings_cache_dir(store: PassageStore, settings: EncoderSettings) -> Path:
    """Where embeddings of this store under these settings are kept by default, shared by all builds."""
    return cache_dir() / "embeddings" / f"{store.sha256[:16]}-{settings.key()}"


def _chunk_path(directory: Path, start: int, end: int) -> Path:
    return directory / f"{start:012d}-{end:012d}.npy"


def _check_embeddings_dir(directory: Path, store: PassageStore, settings: EncoderSettings) -> None:
    meta = {"store_sha256": store.sha256, "num_passages": len(store), "encoder": dataclasses.asdict(settings)}
    path = directory / EMBEDDINGS_META
    if path.exists():
        existing = json.loads(path.read_text())
        if existing != meta:
            raise ValueError(
                f"{directory} holds embeddings of another store or encoder ({path}); "
                "use another embeddings directory or delete it"
            )
    else:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta, indent=2))


def embed_store(
    store: PassageStore,
    settings: EncoderSettings,
    directory: Path,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    encoder_factory: Callable[[EncoderSettings], Encoder] = Encoder,
    progress: bool = True,
) -> EmbeddingChunks:
    """Embeds the passages of the chunks not on disk yet; returns all chunks. Builds that share the
    directory and run at once take turns (the later ones find the chunks done): two writers of one chunk
    would share its temporary file."""
    directory = Path(directory)
    chunks = [(s, min(s + chunk_size, len(store))) for s in range(0, len(store), chunk_size)]
    if (directory / EMBEDDINGS_META).exists() and all(_chunk_path(directory, *c).exists() for c in chunks):
        # All there: no lock, so that finished embeddings can be read from where this process cannot write.
        _check_embeddings_dir(directory, store, settings)
        return EmbeddingChunks(directory, chunks)
    with cache_lock(directory):
        return _embed_missing(store, settings, directory, chunks, encoder_factory, progress)


def _embed_missing(
    store: PassageStore,
    settings: EncoderSettings,
    directory: Path,
    chunks: list[tuple[int, int]],
    encoder_factory: Callable[[EncoderSettings], Encoder],
    progress: bool,
) -> EmbeddingChunks:
    _check_embeddings_dir(directory, store, settings)
    todo = [c for c in chunks if not _chunk_path(directory, *c).exists()]
    encoder: Encoder | None = None
    with tqdm(
        total=len(store),
        initial=len(store) - sum(e - s for s, e in todo),
        desc="embed",
        unit=" passages",
        disable=not progress,
    ) as bar:
        for start, end in todo:
            encoder = encoder or encoder_factory(settings)
            vectors = encoder.encode_passages([p.contents for p in store.iter_range(start, end)])
            path = _chunk_path(directory, start, end)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as handle:
                np.save(handle, vectors)
            os.replace(tmp, path)
            bar.update(end - start)
    return EmbeddingChunks(directory, chunks)


@dataclasses.dataclass(frozen=True)
class EmbeddingChunks:
    directory: Path
    chunks: list[tuple[int, int]]

    def rows(self, start: int, end: int) -> np.ndarray:
        """Embeddings of rows ``start..end``, reading only the chunks that overlap them (memory-mapped)."""
        parts = [
            np.load(_chunk_path(self.directory, s, e), mmap_mode="r")[max(start, s) - s : min(end, e) - s]
            for s, e in self.chunks
            if s < end and e > start
        ]
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def build_index(
    store: PassageStore,
    settings: EncoderSettings,
    out_dir: Path,
    *,
    num_shards: int = 1,
    spec: faiss_index.IndexSpec | None = None,
    gpu: str = "auto",
    embeddings_dir: Path | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    encoder_factory: Callable[[EncoderSettings], Encoder] = Encoder,
    progress: bool = True,
) -> Path:
    """Builds ``num_shards`` shard files and the manifest in ``out_dir``; returns the manifest path."""
    import faiss

    spec = spec or faiss_index.IndexSpec()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranges = shard_ranges(len(store), num_shards)
    on_gpu = faiss_index.use_gpu(gpu, faiss_index.gpu_count(faiss))
    # The passages below are embedded by this same cached export.
    export = encoder_export(settings, out_dir)
    embeddings = embed_store(
        store,
        settings,
        Path(embeddings_dir or embeddings_cache_dir(store, settings)),
        chunk_size=chunk_size,
        encoder_factory=encoder_factory,
        progress=progress,
    )
    entries = []
    dim = 0
    for shard, (start, end) in enumerate(tqdm(ranges, desc="index", unit=" shards", disable=not progress)):
        name = shard_file(shard, num_shards, spec.index_type)
        vectors = embeddings.rows(start, end)
        dim = int(vectors.shape[1])
        index = faiss_index.build(faiss, vectors, spec, on_gpu)
        tmp = out_dir / (name + ".tmp")
        faiss.write_index(index, str(tmp))
        os.replace(tmp, out_dir / name)
        entries.append(shard_entry(out_dir, name, start, end))
    manifest = Manifest.over_store(
        out_dir, encoder=settings, dim=dim, index=spec, store=store, shards=entries, encoder_export=export
    )
    return manifest.save(out_dir)
