"""A shard's FAISS settings reach the thread that searches: its thread count, and the batch size from which a
flat search is one matrix product (BLAS) instead of one pass over the vectors per query row."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.manifest import LoadedManifest
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


def _reference(index_dir: Path, queries: np.ndarray, blas: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scores and rows of FAISS's matrix-product path (``blas``) or its pass-per-row path, on one thread."""
    import faiss

    threads, threshold = faiss.omp_get_max_threads(), faiss.cvar.distance_compute_blas_threshold
    manifest = LoadedManifest(index_dir)
    index = faiss_index.read(faiss, str(manifest.shard_path(0)), "flat", True)
    try:
        faiss.omp_set_num_threads(1)
        faiss.cvar.distance_compute_blas_threshold = 1 if blas else 2**31 - 1
        return index.search(queries, TOP_K)
    finally:
        faiss.omp_set_num_threads(threads)
        faiss.cvar.distance_compute_blas_threshold = threshold


def test_a_shard_scores_a_batch_of_its_blas_rows_with_one_matrix_product(
    index_dirs: dict[int, Path], encoder: Encoder, questions: list[str], store: PassageStore,
    processes: list[ServiceProcess], tmp_path: Path,
) -> None:
    index = index_dirs[1]
    flags = ("--search-threads", "1", "--blas-rows-per-thread", str(BLAS_ROWS))
    (target,) = start_shards(index, 1, tmp_path, processes, *flags)
    batch = encoder.encode_queries(questions[:BLAS_ROWS])
    by_product, by_pass = _reference(index, batch, blas=True), _reference(index, batch, blas=False)
    # The two paths sum in different orders: some score differs in its last bits, which tells them apart.
    assert not np.array_equal(by_product[0], by_pass[0]), "both paths gave the same bits: nothing to tell apart"

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

    # BLAS_ROWS rows: one matrix product; one row fewer: a pass per row, as FAISS's own threshold would.
    assert asyncio.run(served(batch)) == expected(*by_product)
    fewer = batch[: BLAS_ROWS - 1]
    assert asyncio.run(served(fewer)) == expected(*_reference(index, fewer, blas=False))


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
