"""``ShardSearcher``: it refuses files that do not match the manifest, a memory-mapped shard answers as one read
whole, and its FAISS settings reach the thread that searches (its thread count, and the batch size from which a
flat search is one matrix product (BLAS) instead of one pass over the vectors for all its rows). Served as a process:
test_shard_checksum.py (the background checksum) and test_services.py."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.manifest import LoadedManifest, ManifestMismatch
from ragr1.services.retriever.scan import FlatScan, flat_vectors
from ragr1.services.retriever.shard import ShardSearcher, ShardSettings
from ragr1.services.retriever.shard_client import AsyncShardClient
from tests.retriever.processes import start_shards

TOP_K = 10
BLAS_ROWS = 4


def test_search_threads_are_set_on_the_thread_that_searches(index_dirs: dict[int, Path]) -> None:
    import faiss

    # Not the count a new thread starts with, so that a setting made on any other thread than the index's
    # (which is what the shard once did) shows here.
    with ThreadPoolExecutor(1) as fresh:
        wanted = fresh.submit(faiss.omp_get_max_threads).result() + 1
    settings = ShardSettings(search_threads=wanted, blas_rows_per_thread=BLAS_ROWS)
    searcher = ShardSearcher(LoadedManifest(index_dirs[1]), 0, settings)
    try:
        assert searcher.search_threads == wanted
    finally:
        asyncio.run(searcher.aclose())


def _reference(index_dir: Path, queries: np.ndarray, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Scores and rows on one thread by FAISS's matrix-product path (``blas``), its pass-per-row path (``rows``) or
    the one-pass scan (``scan``)."""
    import faiss

    threads, threshold = faiss.omp_get_max_threads(), faiss.cvar.distance_compute_blas_threshold
    manifest = LoadedManifest(index_dir)
    index = faiss_index.read(faiss, str(manifest.shard_path(0)), "flat", True)
    if path == "scan":
        return FlatScan(flat_vectors(faiss, index), "ip").search(queries, TOP_K)
    try:
        faiss.omp_set_num_threads(1)
        faiss.cvar.distance_compute_blas_threshold = 1 if path == "blas" else 2**31 - 1
        return index.search(queries, TOP_K)
    finally:
        faiss.omp_set_num_threads(threads)
        faiss.cvar.distance_compute_blas_threshold = threshold


@pytest.mark.parametrize("blocked_scan", [True, False])
def test_a_shard_scores_a_batch_by_its_size_one_matrix_product_or_one_pass(
    index_dirs: dict[int, Path], encoder: Encoder, questions: list[str], store: PassageStore,
    processes: list[ServiceProcess], tmp_path: Path, blocked_scan: bool,
) -> None:
    index = index_dirs[1]
    scan_flag = "--blocked-scan" if blocked_scan else "--no-blocked-scan"
    flags = ("--search-threads", "1", "--blas-rows-per-thread", str(BLAS_ROWS), scan_flag)
    (target,) = start_shards(index, 1, tmp_path, processes, *flags)
    batch = encoder.encode_queries(questions[:BLAS_ROWS])
    fewer = batch[: BLAS_ROWS - 1]
    by_path = {path: _reference(index, fewer, path) for path in ("blas", "rows", "scan")}
    # The paths sum in different orders: some score differs in its last bits, which tells them apart.
    for a, b in (("blas", "rows"), ("blas", "scan"), ("rows", "scan")):
        assert not np.array_equal(by_path[a][0], by_path[b][0]), f"{a} and {b} gave the same bits"

    async def served(rows: np.ndarray) -> list[list[tuple[str, np.float32]]]:
        client = AsyncShardClient(target)
        try:
            hits = await client.search(rows, TOP_K, omit_text=True, timeout=30)
        finally:
            await client.close()
        return [[(h.id, np.float32(h.score)) for h in row] for row in hits]

    def expected(scores: np.ndarray, rows: np.ndarray) -> list[list[tuple[str, np.float32]]]:
        pairs = zip(scores, rows, strict=True)
        return [[(store[int(r)].id, np.float32(s)) for s, r in zip(ss, rr, strict=True)] for ss, rr in pairs]

    # BLAS_ROWS rows: one matrix product. Fewer, from 2: one pass for all of them (or, with the scan off, a pass per
    # row, as FAISS's own threshold would). One row: FAISS's pass.
    assert asyncio.run(served(batch)) == expected(*_reference(index, batch, "blas"))
    assert asyncio.run(served(fewer)) == expected(*by_path["scan" if blocked_scan else "rows"])
    assert asyncio.run(served(batch[:1])) == expected(*_reference(index, batch[:1], "rows"))


@pytest.mark.parametrize("rows_per_thread", [0, 4])
def test_the_threshold_scales_with_the_threads_and_zero_keeps_faiss_own(rows_per_thread: int) -> None:
    import faiss

    before = faiss.cvar.distance_compute_blas_threshold
    try:
        faiss_index.set_blas_rows(faiss, rows_per_thread, 384)
        expected = before if rows_per_thread == 0 else rows_per_thread * faiss.omp_get_max_threads() * 384
        assert faiss.cvar.distance_compute_blas_threshold == expected
    finally:
        faiss.cvar.distance_compute_blas_threshold = before


def test_shard_refuses_files_that_do_not_match_the_manifest(index_dirs: dict[int, Path], tmp_path: Path) -> None:
    loaded = LoadedManifest(index_dirs[2])
    shard_file = loaded.shard_path(1)
    original = shard_file.read_bytes()
    try:
        shard_file.write_bytes(original[:-8] + b"\0" * 8)
        with pytest.raises(ManifestMismatch, match=r"shard 1: .* has sha256 .* the manifest says"):
            ShardSearcher(loaded, 1, ShardSettings(checksum="start"))
    finally:
        shard_file.write_bytes(original)
    with pytest.raises(ManifestMismatch, match="shard 2 does not exist"):
        ShardSearcher(loaded, 2, ShardSettings())
    # A truncated file is refused at start even when its checksum is left for later, or never checked.
    try:
        shard_file.write_bytes(original[:-8])
        with pytest.raises(ManifestMismatch, match=rf"shard 1: .* has {len(original) - 8} bytes, the manifest says"):
            ShardSearcher(loaded, 1, ShardSettings(checksum="background"))
        with pytest.raises(ManifestMismatch, match=rf"shard 1: .* has {len(original) - 8} bytes, the manifest says"):
            ShardSearcher(loaded, 1, ShardSettings(checksum="off"))
    finally:
        shard_file.write_bytes(original)
    # The right file under another manifest (other ranges): the vector count gives it away.
    other = json.loads(loaded.path.read_text())
    other["shards"][1]["end"] -= 1
    other["store_dir"] = str(loaded.store_path().resolve())
    (tmp_path / "manifest.json").write_text(json.dumps(other))
    (tmp_path / shard_file.name).write_bytes(original)
    with pytest.raises(ManifestMismatch, match="index holds 1000 vectors, the manifest says 999"):
        ShardSearcher(LoadedManifest(tmp_path), 1, ShardSettings())
    other["shards"][1]["end"] += 1
    other["store_sha256"] = "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(other))
    with pytest.raises(ManifestMismatch, match="is not the one the index was built from"):
        ShardSearcher(LoadedManifest(tmp_path), 1, ShardSettings())


def test_a_memory_mapped_shard_answers_as_one_read_whole(index_dirs: dict[int, Path], encoder: Encoder) -> None:
    loaded = LoadedManifest(index_dirs[2])
    queries = encoder.encode_queries(["Neil Peart", "Which band released Counterparts?"])

    async def search(mmap: bool) -> list[list[tuple[str, float]]]:
        searcher = ShardSearcher(loaded, 1, ShardSettings(mmap=mmap))
        try:
            return [[(h.id, h.score) for h in hits] for hits in await searcher.search(queries, 5)]
        finally:
            await searcher.aclose()

    assert asyncio.run(search(True)) == asyncio.run(search(False))
