"""``ivf_scan.IvfScan``: an IVF shard's search of several rows in one visit of the union of their probed lists, on real
IVF shards of the shipped corpus's embeddings (IVF-PQ 64x8 and IVF-flat, inner product, ``conftest.ivf_dirs``), opened
as a shard opens them (memory-mapped, or read whole), with real questions, against FAISS's ``index.search`` and
against exact (float64) scores of the same entries.

FAISS and the scan sum a score's terms in different orders, so a score may differ in its last bits and two entries
whose scores are that close may swap. An IVF-PQ score is <q, c_list> (d products summed) plus M table terms, each
<q_m, p_{m,code}> (d/M products summed): every product goes through at most d + M + 2 float32 roundings, so each
path's score is within (d + M + 2) * u * T of the exact one, T the sum of the products' magnitudes and u the unit
roundoff; two paths are within twice that of each other. IVF-flat: d products, as the flat scan's bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.ivf_file import IvfSource
from ragr1.services.retriever.ivf_scan import EMPTY, IvfScan, uncovered
from ragr1.services.retriever.manifest import LoadedManifest
from tests.retriever.conftest import IVF_LISTS, IVF_PROBES

UNIT_ROUNDOFF = 2.0**-24
KINDS = ("ivfpq", "ivfflat")


def _open(index_dir: Path, kind: str, mmap: bool) -> Any:
    """The shard's FAISS index as the shard opens and prepares it."""
    import faiss

    manifest = LoadedManifest(index_dir)
    index = faiss_index.read(faiss, str(manifest.shard_path(0)), kind, mmap)
    return faiss_index.prepare_for_search(faiss, index, manifest.manifest.index, False)


class Exact:
    """Every entry of an IVF shard file with its float64 score per query and that score's rounding bound, read by
    range from the file (``IvfSource``), not through FAISS's lists."""

    def __init__(self, index_dir: Path, index: Any) -> None:
        import faiss

        self.ivf = faiss.downcast_index(index)
        source = IvfSource.open(LoadedManifest(index_dir).shard_path(0))
        self.lists = [(source.ids(i), source.codes(i)) for i in range(self.ivf.nlist)]
        self.centroids = self.ivf.quantizer.reconstruct_n(0, self.ivf.nlist).astype(np.float64)
        self.pq = isinstance(self.ivf, faiss.IndexIVFPQ)
        if self.pq:
            pq = self.ivf.pq
            self.books = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub).astype(np.float64)

    def scores(self, query: np.ndarray, list_no: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The list's ids, their exact scores for ``query`` and each score's bound (one path's)."""
        ids, codes = self.lists[list_no]
        q = query.astype(np.float64)
        d = len(q)
        if not self.pq:
            x = codes.view(np.float32).reshape(len(ids), d).astype(np.float64)
            return ids, x @ q, (d + 4) * UNIT_ROUNDOFF * (np.abs(x) @ np.abs(q))
        m_count, _, dsub = self.books.shape
        sub = q.reshape(m_count, dsub)
        terms = np.einsum("mjt,mt->mj", self.books, sub)  # <q_m, p_{m,j}>
        sizes = np.einsum("mjt,mt->mj", np.abs(self.books), np.abs(sub))
        picked = np.arange(m_count)[None, :], codes.astype(np.int64)
        centroid = self.centroids[list_no]
        exact = centroid @ q + terms[picked].sum(axis=1)
        magnitude = np.abs(centroid) @ np.abs(q) + sizes[picked].sum(axis=1)
        return ids, exact, (d + m_count + 2) * UNIT_ROUNDOFF * magnitude

    def check(self, queries: np.ndarray, k: int, scores: np.ndarray, rows: np.ndarray) -> float:
        """The scan's answer checked against the exact scores of each row's probed lists; returns the largest bound
        (for comparing with FAISS's scores)."""
        _, assigned = self.ivf.quantizer.search(queries, self.ivf.nprobe)
        assert scores.shape == rows.shape == (len(queries), k)
        widest = 0.0
        for q, query in enumerate(queries):
            parts = [self.scores(query, int(list_no)) for list_no in assigned[q]]
            ids = np.concatenate([p[0] for p in parts])
            exact = dict(zip(ids.tolist(), np.concatenate([p[1] for p in parts]).tolist(), strict=True))
            bound = dict(zip(ids.tolist(), np.concatenate([p[2] for p in parts]).tolist(), strict=True))
            found = min(k, len(ids))
            hits = rows[q, :found]
            assert len(set(hits.tolist())) == found and all(int(h) in exact for h in hits), "a hit not in its lists"
            assert np.all(np.diff(scores[q, :found]) <= 0), "hits not best first"
            for h, s in zip(hits.tolist(), scores[q, :found].tolist(), strict=True):
                assert abs(s - exact[h]) <= bound[h], f"row {q}: entry {h} scored {s}, exactly {exact[h]}"
            widest = max(widest, max(bound.values()))
            kth = np.sort(np.fromiter(exact.values(), float))[::-1][found - 1]
            assert min(exact[h] for h in hits.tolist()) >= kth - 2 * widest, "a hit outside the exact k best"
            # Past what the probed lists hold: FAISS's contract, no row and its lowest score.
            assert (rows[q, found:] == -1).all() and (scores[q, found:] == EMPTY).all()
        return widest


def _as_faiss(index: Any, queries: np.ndarray, k: int, scores: np.ndarray, rows: np.ndarray, bound: float) -> None:
    """The same ids as FAISS's search (where two scores are closer than two bounds, either order) and its scores
    within the two paths' rounding."""
    theirs_scores, theirs_rows = index.search(queries, k)
    np.testing.assert_allclose(scores, theirs_scores, rtol=0, atol=2 * bound)
    for q in range(len(queries)):
        s = theirs_scores[q]
        gap = np.minimum(np.abs(np.diff(s, prepend=np.inf)), np.abs(np.diff(s, append=-np.inf)))
        clear = gap > 4 * bound
        np.testing.assert_array_equal(rows[q, clear], theirs_rows[q, clear])
        assert set(rows[q].tolist()) == set(theirs_rows[q].tolist()) or not clear.all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("mmap", "threads"), [(True, 1), (False, 1), (True, 3)])
def test_the_scan_answers_as_faiss_for_1_to_10_rows(
    ivf_dirs: dict[str, Path], encoder: Encoder, questions: list[str], kind: str, mmap: bool, threads: int
) -> None:
    import faiss

    index = _open(ivf_dirs[kind], kind, mmap)
    exact = Exact(ivf_dirs[kind], index)
    scan = IvfScan(faiss, index, threads)
    try:
        for count in range(1, 11):
            queries = encoder.encode_queries(questions[10 * count : 10 * count + count])
            scores, rows = scan.search(queries, 10)
            _as_faiss(index, queries, 10, scores, rows, exact.check(queries, 10, scores, rows))
    finally:
        scan.close()


@pytest.mark.parametrize("kind", KINDS)
def test_rows_whose_lists_overlap_and_rows_whose_lists_do_not(
    ivf_dirs: dict[str, Path], encoder: Encoder, questions: list[str], kind: str
) -> None:
    import faiss

    index = _open(ivf_dirs[kind], kind, True)
    exact = Exact(ivf_dirs[kind], index)
    scan = IvfScan(faiss, index)
    every = encoder.encode_queries(questions[:200])
    _, assigned = scan.assign(every)
    probed = [set(a.tolist()) for a in assigned]
    # Three questions that share no list, and a question with two others that probe most of its lists (its own
    # words reordered would do; the slice's questions have such neighbours).
    apart = [0]
    for i in range(1, len(probed)):
        if len(apart) < 3 and all(not probed[i] & probed[j] for j in apart):
            apart.append(i)
    near = sorted(range(1, len(probed)), key=lambda i: -len(probed[i] & probed[0]))[:2]
    for chosen, union in ((apart, 3 * IVF_PROBES), ([0, *near], None)):
        queries = every[chosen]
        lists = set().union(*(probed[i] for i in chosen))
        if union is not None:
            assert len(chosen) == 3 and len(lists) == union, "no three questions with disjoint lists"
        else:
            assert len(lists) < 3 * IVF_PROBES - 2, "the near questions share no more than a list"
        scores, rows = scan.search(queries, 10)
        _as_faiss(index, queries, 10, scores, rows, exact.check(queries, 10, scores, rows))
    # A row repeated: its lists are the other's, visited once, and both answers are the same.
    twice = every[[3, 3, 5]]
    scores, rows = scan.search(twice, 10)
    np.testing.assert_array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(scores[0], scores[1])
    scan.close()


@pytest.mark.parametrize("kind", KINDS)
def test_k_beyond_what_the_probed_lists_hold(ivf_dirs: dict[str, Path], encoder: Encoder, questions: list[str],
                                             kind: str) -> None:
    import faiss

    index = _open(ivf_dirs[kind], kind, True)
    exact = Exact(ivf_dirs[kind], index)
    scan = IvfScan(faiss, index, 2)
    queries = encoder.encode_queries(questions[:3])
    k = 2000 * IVF_PROBES // IVF_LISTS * 3  # about three times what a row's lists hold
    scores, rows = scan.search(queries, k)
    bound = exact.check(queries, k, scores, rows)
    assert (rows[:, -1] == -1).all()
    theirs_scores, theirs_rows = index.search(queries, k)
    np.testing.assert_array_equal(rows < 0, theirs_rows < 0)
    np.testing.assert_array_equal(scores[rows < 0], theirs_scores[theirs_rows < 0])
    _as_faiss(index, queries, k, scores, rows, bound)
    scan.close()


def test_the_scan_names_what_it_cannot_search(ivf_dirs: dict[str, Path], encoder: Encoder,
                                              questions: list[str]) -> None:
    import faiss

    vectors = encoder.encode_queries(questions[:64])
    others = {
        "IndexIVFPQ by L2": faiss.index_factory(384, "IVF2,PQ16x4", faiss.METRIC_L2),
        "PQ codes of 4 bits, not 8": faiss.index_factory(384, "IVF2,PQ16x4", faiss.METRIC_INNER_PRODUCT),
        "IndexFlatIP, not": faiss.IndexFlatIP(384),
        "IndexPreTransform, not": faiss.index_factory(384, "PCA64,IVF2,Flat", faiss.METRIC_INNER_PRODUCT),
    }
    for why, index in others.items():
        assert why in (uncovered(faiss, index) or ""), why
        with pytest.raises(ValueError, match=f"IvfScan cannot search this index: {why}"):
            IvfScan(faiss, index)
    residual = _open(ivf_dirs["ivfpq"], "ivfpq", False)
    faiss.downcast_index(residual).by_residual = False
    assert uncovered(faiss, residual) == "PQ codes not by residual"
    scan = IvfScan(faiss, _open(ivf_dirs["ivfpq"], "ivfpq", True))
    with pytest.raises(ValueError, match=r"queries must be r x 384, got shape \(2, 3\)"):
        scan.search(np.zeros((2, 3), np.float32), 5)
    with pytest.raises(ValueError, match="k must be positive, got 0"):
        scan.search(vectors[:2], 0)
    scan.close()
