from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import pytest

from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.build import embed_store, embeddings_cache_dir
from ragr1.services.retriever.corpus import PassageStore, read_corpus, write_store
from ragr1.services.retriever.encoder import Encoder, EncoderSettings
from ragr1.services.retriever.manifest import LoadedManifest, shard_ranges
from ragr1.shipped import corpus_path


def test_gpu_selection() -> None:
    assert faiss_index.use_gpu("auto", 2) and not faiss_index.use_gpu("auto", 0)
    assert not faiss_index.use_gpu("never", 4)
    assert faiss_index.use_gpu("always", 1)
    with pytest.raises(ValueError, match="sees no GPU"):
        faiss_index.use_gpu("always", 0)
    with pytest.raises(ValueError, match="gpu mode must be one of"):
        faiss_index.use_gpu("sometimes", 1)
    # This machine has faiss-cpu: auto means the CPU, through the same code path.
    assert not faiss_index.use_gpu("auto", faiss_index.gpu_count(faiss))


def test_shard_ranges_cover_every_row_once() -> None:
    assert shard_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ValueError, match="some shard would be empty"):
        shard_ranges(2, 3)


class CountingEncoder(Encoder):
    """The real encoder, counting the passages it embeds."""

    embedded = 0

    def encode_passages(self, contents: Sequence[str], *, progress: bool = False) -> np.ndarray:
        CountingEncoder.embedded += len(contents)
        return super().encode_passages(contents, progress=progress)


def test_build_resumes_from_saved_chunks(tmp_path: Path, settings: EncoderSettings) -> None:
    store = write_store(read_corpus([corpus_path()], limit=48), tmp_path / "store", progress=False)
    short = dataclasses.replace(settings, max_passage_tokens=32)  # cheap: the test is about chunks
    emb = tmp_path / "emb"
    first = embed_store(store, short, emb, chunk_size=16, encoder_factory=CountingEncoder, progress=False)
    assert CountingEncoder.embedded == 48
    (emb / "000000000016-000000000032.npy").unlink()  # as if the build had died in chunk 2
    CountingEncoder.embedded = 0
    again = embed_store(store, short, emb, chunk_size=16, encoder_factory=CountingEncoder, progress=False)
    assert CountingEncoder.embedded == 16
    np.testing.assert_allclose(again.rows(0, 48), first.rows(0, 48), atol=1e-6)
    with pytest.raises(ValueError, match="another store or encoder"):
        embed_store(store, settings, emb, chunk_size=16, progress=False)


def test_manifest_describes_the_build(
    index_dirs: dict[int, Path], store: PassageStore, settings: EncoderSettings
) -> None:
    loaded = LoadedManifest(index_dirs[3])
    m = loaded.manifest
    assert m.encoder == settings and m.dim == 384 and m.index.index_type == "flat"
    assert [(s.start, s.end) for s in m.shards] == shard_ranges(len(store), 3)
    assert m.store_sha256 == store.sha256 and loaded.store_path().resolve() == store.directory.resolve()
    assert (embeddings_cache_dir(store, settings) / "embeddings.json").exists()


def test_compressed_indexes_find_most_of_the_exact_neighbours(
    store: PassageStore, settings: EncoderSettings, tmp_path: Path
) -> None:
    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings), progress=False).rows(0, len(store))
    queries = vectors[::20]
    _, exact = faiss_index.build(faiss, vectors, faiss_index.IndexSpec("flat"), False).search(queries, 10)
    # 4-bit codes: this faiss-cpu build trains 8-bit PQ codebooks slowly (minutes for 2,000 vectors).
    ivfpq = faiss_index.IndexSpec("ivfpq", nlist=16, pq_m=48, pq_bits=4, nprobe=8)
    for spec in (faiss_index.IndexSpec("hnsw"), ivfpq):
        built = faiss_index.build(faiss, vectors, spec, False)
        index = faiss_index.prepare_for_search(faiss, built, spec, False)
        _, found = index.search(queries, 10)
        overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, found, strict=True)])
        assert overlap > (0.95 if spec.index_type == "hnsw" else 0.45), (spec.index_type, overlap)
        # Memory-mapped, each kind answers exactly as it does read whole.
        path = tmp_path / f"{spec.index_type}.faiss"
        faiss.write_index(built, str(path))
        opened = faiss_index.read(faiss, str(path), spec.index_type, True)
        mapped = faiss_index.prepare_for_search(faiss, opened, spec, False)
        np.testing.assert_array_equal(mapped.search(queries, 10)[1], found)
