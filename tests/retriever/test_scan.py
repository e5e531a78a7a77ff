"""``scan.FlatScan``: a flat index's exact search of several rows in one pass, on a real shard file of the shipped
corpus's embeddings (memory-mapped, as a shard opens it) and real questions, against exact scores.

FAISS and the scan sum a row's products in different orders, so a score may differ in its last bits and two
passages whose scores are that close may swap. The tolerance is float32 summation's error bound, about d * u times
the sum of the terms' magnitudes (u the unit roundoff), for each of the two: every hit's score must be its exact
(float64) score within it, and each rank's score the exact k-best's at that rank within it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.services.retriever.scan import GROUP, FlatScan, flat_vectors

UNIT_ROUNDOFF = 2.0**-24


def _vectors(index_dir: Path) -> tuple[object, np.ndarray]:
    """The single shard's FAISS index, memory-mapped, and its vectors as the shard hands them to the scan."""
    import faiss

    manifest = LoadedManifest(index_dir)
    index = faiss_index.read(faiss, str(manifest.shard_path(0)), "flat", True)
    return index, flat_vectors(faiss, index)


def _exact(vectors: np.ndarray, queries: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Every vector's exact score per query (higher is better) and each score's rounding bound."""
    x, q = vectors.astype(np.float64), queries.astype(np.float64)
    products = np.abs(q)[:, None, :] * np.abs(x)[None, :, :]
    if metric == "ip":
        terms = products.sum(axis=2)
        score = q @ x.T
    else:  # either path's sum of squared differences, or the scan's |q|^2 - 2 x.q + |x|^2
        terms = ((q**2).sum(axis=1)[:, None] + 2 * products.sum(axis=2) + (x**2).sum(axis=1)[None, :])
        score = -((q[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    # d products, each rounded once, summed in d roundings, and a few more to combine them; x2 for the other path.
    bound = 2 * (vectors.shape[1] + 4) * UNIT_ROUNDOFF * terms
    return score, bound


def _check(vectors: np.ndarray, queries: np.ndarray, metric: str, k: int, scores: np.ndarray,
           rows: np.ndarray) -> None:
    exact, bound = _exact(vectors, queries, metric)
    found = min(k, len(vectors))
    assert scores.shape == rows.shape == (len(queries), k)
    for q in range(len(queries)):
        hits = rows[q, :found]
        assert len(set(hits.tolist())) == found and (hits >= 0).all()
        higher = scores[q, :found] if metric == "ip" else -scores[q, :found]
        assert np.all(np.abs(higher - exact[q, hits]) <= bound[q, hits]), "a score off its passage's exact score"
        assert np.all(np.diff(higher) <= 0), "hits not best first"
        best = np.sort(exact[q])[::-1][:found]
        assert np.all(exact[q, hits] >= best - 2 * bound[q].max()), "a hit outside the exact k best"
        # Past the index's end: FAISS's contract, no row and the worst score.
        assert (rows[q, found:] == -1).all()
        assert np.all(scores[q, found:] == (-np.inf if metric == "ip" else np.inf))


@pytest.mark.parametrize("threads", [1, 3])
def test_the_scan_finds_the_exact_k_best_of_every_row(
    index_dirs: dict[int, Path], encoder: Encoder, questions: list[str], threads: int
) -> None:
    index, vectors = _vectors(index_dirs[1])
    scan = FlatScan(vectors, "ip", threads)
    try:
        # Rows across the groups' edges: a lone row, a short group (2 and 3 rows), a full one, one into the next.
        for count in (1, 2, GROUP - 1, GROUP, GROUP + 1, 2 * GROUP + 2):
            queries = encoder.encode_queries(questions[:count])
            scores, rows = scan.search(queries, 10)
            _check(vectors, queries, "ip", 10, scores, rows)
            reference_scores, reference_rows = index.search(queries, 10)  # type: ignore[attr-defined]
            # Real questions have no near ties at their best hit: the same passage as FAISS's.
            assert (rows[:, 0] == reference_rows[:, 0]).all()
            tolerance = float(_exact(vectors, queries, "ip")[1].max())
            np.testing.assert_allclose(scores, reference_scores, rtol=0, atol=tolerance)
    finally:
        scan.close()


def test_the_scan_by_l2_and_past_the_index_end(index_dirs: dict[int, Path], encoder: Encoder,
                                               questions: list[str]) -> None:
    import faiss

    _, vectors = _vectors(index_dirs[1])
    few = np.ascontiguousarray(vectors[:7])
    queries = encoder.encode_queries(questions[:3])
    for metric, threads in (("l2", 1), ("l2", 2), ("ip", 2)):
        scan = FlatScan(few, metric, threads)
        try:
            scores, rows = scan.search(queries, 12)  # more than the 7 vectors, each thread's share fewer still
            _check(few, queries, metric, 12, scores, rows)
        finally:
            scan.close()
    # Where rounding cannot swap neighbours, L2 distances are FAISS's own ranking.
    big = FlatScan(vectors, "l2")
    scores, rows = big.search(queries, 5)
    reference = faiss.IndexFlatL2(vectors.shape[1])
    reference.add(vectors)
    _, reference_rows = reference.search(queries, 5)
    assert (rows[:, 0] == reference_rows[:, 0]).all()
    big.close()


def test_the_scan_refuses_what_it_cannot_search(index_dirs: dict[int, Path]) -> None:
    _, vectors = _vectors(index_dirs[1])
    with pytest.raises(ValueError, match="metric must be one of"):
        FlatScan(vectors, "cosine")
    with pytest.raises(ValueError, match="C-contiguous n x d float32"):
        FlatScan(vectors.astype(np.float64), "ip")
    scan = FlatScan(vectors, "ip")
    with pytest.raises(ValueError, match=r"queries must be r x 384, got shape \(2, 3\)"):
        scan.search(np.zeros((2, 3), np.float32), 5)
    with pytest.raises(ValueError, match="k must be positive, got 0"):
        scan.search(np.zeros((2, 384), np.float32), 0)
    scan.close()
