"""An IVF index's search of several query rows that reads each probed inverted list once, for all the rows that
probe it (CPU).

FAISS's IVF search scans each row's ``nprobe`` lists for that row alone: the queries of a multi-query call, related
questions whose lists overlap, read and decode a list they share once per row. This search assigns every row its
lists with the index's own coarse quantizer (as FAISS's search does), takes the union of them, and visits each list
of the union once, scoring its entries for every row that probes it, keeping each row's best ``k`` in a heap (the flat
scan's, ``scan._push``). Its compiled kernels (numba) release the GIL, so that a shard with more than one search
thread splits the union's lists among them, as FAISS would split the rows.

- IVF-PQ (inner product, by residual, 8-bit codes: what ``ragr1 index build`` makes): an entry's score for row q is
  <q, c_list> + sum_m <q_m, p_{m,code_m}>, the coarse centroid's product (the quantizer's own score, which FAISS adds
  too) and a sum of M terms of a table that depends on the row, not on the list: each row's table is computed once.
  The tables lie row-innermost, ``GROUP`` rows side by side (``tables[g, m, code, lane]``), so that an entry's code
  byte fetches its term for a group's rows in one load: the lookups a row adds cost little beside its first.
- IVF-flat (inner product): each list's vectors against the rows, ``GROUP`` rows at a time, as the flat scan.

What the kernels do not cover keeps FAISS's search (``uncovered`` says why): L2 (an IVF-PQ distance to a residual has
a term per list and code, not a table per row; imported L2 indexes are rare), PQ codes of other than 8 bits (packed
across bytes), codes not by residual, polysemous filtering or a cap on the codes scanned (they change which entries
count), indexes wrapped in a transform, and lists other than FAISS's array or memory-mapped ones.

The lists are read where the index holds them, through FAISS's own pointer to each list's codes and ids: into its
memory map of the file when the shard opened it with ``IO_FLAG_MMAP`` (``OnDiskInvertedLists``), into its arrays
when it read the file whole (``ArrayInvertedLists``). Nothing is copied; the pointers are valid while the index lives
(the scan holds it).

Scores are FAISS's inner products, with row -1 and FAISS's lowest score (-FLT_MAX) where the probed lists hold fewer
than ``k`` entries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Any

import numpy as np
from numba import carray, types
from numba.core import cgutils
from numba.extending import intrinsic

from ragr1.services.retriever.scan import _jit, _push

# Rows scored together: one entry's terms for four rows are one 16-byte load.
GROUP = 4
# The score FAISS's IVF search gives where it found no entry (its heap's initial value).
EMPTY = np.float32(-np.finfo(np.float32).max)


@intrinsic
def _pointer(typingctx: Any, address: Any) -> Any:
    # An address (int64) as the void pointer numba's carray views: the lists live in FAISS's memory, not numpy's.
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@_jit
def _tables(queries: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    # queries: R x d (R a multiple of GROUP); centroids: M x ksub x dsub. Out: R/GROUP x M x ksub x GROUP, out[g, m, j,
    # lane] = <q_m, p_{m,j}> of row g * GROUP + lane.
    r = queries.shape[0]
    m_count, ksub, dsub = centroids.shape
    out = np.empty((r // GROUP, m_count, ksub, GROUP), dtype=np.float32)
    for q in range(r):
        g, lane = q // GROUP, q % GROUP
        for m in range(m_count):
            for j in range(ksub):
                s = np.float32(0.0)
                for t in range(dsub):
                    s += queries[q, m * dsub + t] * centroids[m, j, t]
                out[g, m, j, lane] = s
    return out


@_jit
def _scan_pq(code_at: np.ndarray, id_at: np.ndarray, sizes: np.ndarray, lists: np.ndarray, probes: np.ndarray,
             coarse: np.ndarray, tables: np.ndarray, k: int, best: np.ndarray, rows: np.ndarray) -> None:
    # lists: the union's lists this call visits; probes[u, q]: whether row q probes lists[u], coarse[u, q] its
    # <q, c_list>. best/rows: a min-heap of k scores per row.
    groups, m_count = tables.shape[0], tables.shape[1]
    for u in range(len(lists)):
        list_no = lists[u]
        n = sizes[list_no]
        codes = carray(_pointer(code_at[list_no]), (n, m_count), np.uint8)
        ids = carray(_pointer(id_at[list_no]), (n,), np.int64)
        for g in range(groups):
            q0 = g * GROUP
            p0, p1, p2, p3 = probes[u, q0], probes[u, q0 + 1], probes[u, q0 + 2], probes[u, q0 + 3]
            if not (p0 or p1 or p2 or p3):
                continue
            if p0 + p1 + p2 + p3 == 1:
                # One row of the group probes the list: its lane alone, as FAISS's scan of that row would.
                lane = 0 if p0 else 1 if p1 else 2 if p2 else 3
                q = q0 + lane
                c = coarse[u, q]
                for j in range(n):
                    s = np.float32(0.0)
                    for m in range(m_count):
                        s += tables[g, m, codes[j, m], lane]
                    s += c
                    if s > best[q, 0]:
                        _push(best, rows, q, s, ids[j], k)
                continue
            c0, c1, c2, c3 = coarse[u, q0], coarse[u, q0 + 1], coarse[u, q0 + 2], coarse[u, q0 + 3]
            for j in range(n):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                s2 = np.float32(0.0)
                s3 = np.float32(0.0)
                for m in range(m_count):
                    c = codes[j, m]
                    s0 += tables[g, m, c, 0]
                    s1 += tables[g, m, c, 1]
                    s2 += tables[g, m, c, 2]
                    s3 += tables[g, m, c, 3]
                s0 += c0
                s1 += c1
                s2 += c2
                s3 += c3
                row = ids[j]
                if p0 and s0 > best[q0, 0]:
                    _push(best, rows, q0, s0, row, k)
                if p1 and s1 > best[q0 + 1, 0]:
                    _push(best, rows, q0 + 1, s1, row, k)
                if p2 and s2 > best[q0 + 2, 0]:
                    _push(best, rows, q0 + 2, s2, row, k)
                if p3 and s3 > best[q0 + 3, 0]:
                    _push(best, rows, q0 + 3, s3, row, k)


@_jit
def _scan_flat(code_at: np.ndarray, id_at: np.ndarray, sizes: np.ndarray, lists: np.ndarray, probes: np.ndarray,
               queries: np.ndarray, k: int, best: np.ndarray, rows: np.ndarray) -> None:
    # As _scan_pq, each list's entries d float32 each, scored against the rows (R x d) by inner product.
    r, d = queries.shape
    for u in range(len(lists)):
        list_no = lists[u]
        n = sizes[list_no]
        vectors = carray(_pointer(code_at[list_no]), (n, d), np.float32)
        ids = carray(_pointer(id_at[list_no]), (n,), np.int64)
        for q0 in range(0, r, GROUP):
            p0, p1, p2, p3 = probes[u, q0], probes[u, q0 + 1], probes[u, q0 + 2], probes[u, q0 + 3]
            if not (p0 or p1 or p2 or p3):
                continue
            for j in range(n):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                s2 = np.float32(0.0)
                s3 = np.float32(0.0)
                for t in range(d):
                    x = vectors[j, t]
                    s0 += x * queries[q0, t]
                    s1 += x * queries[q0 + 1, t]
                    s2 += x * queries[q0 + 2, t]
                    s3 += x * queries[q0 + 3, t]
                row = ids[j]
                if p0 and s0 > best[q0, 0]:
                    _push(best, rows, q0, s0, row, k)
                if p1 and s1 > best[q0 + 1, 0]:
                    _push(best, rows, q0 + 1, s1, row, k)
                if p2 and s2 > best[q0 + 2, 0]:
                    _push(best, rows, q0 + 2, s2, row, k)
                if p3 and s3 > best[q0 + 3, 0]:
                    _push(best, rows, q0 + 3, s3, row, k)


# Compiled on first use and cached on disk where numba can write, as scan.py's kernels.
for _compiled in (_tables, _scan_pq, _scan_flat):
    with contextlib.suppress(RuntimeError, OSError):
        _compiled.enable_caching()


def uncovered(faiss: Any, index: Any) -> str | None:
    """Why ``IvfScan`` cannot search ``index`` (a CPU index), or None where it can."""
    top = faiss.downcast_index(index)
    kind = type(top).__name__
    if type(top) not in (faiss.IndexIVFPQ, faiss.IndexIVFFlat):
        return f"{kind}, not an IndexIVFPQ or IndexIVFFlat"
    if top.metric_type != faiss.METRIC_INNER_PRODUCT:
        return f"{kind} by L2: the kernels score inner products"
    if top.max_codes:
        return f"{kind} scans at most {top.max_codes} codes a row"
    if isinstance(top, faiss.IndexIVFPQ):
        if top.pq.nbits != 8:
            return f"PQ codes of {top.pq.nbits} bits, not 8"
        if not top.by_residual:
            return "PQ codes not by residual"
        if top.polysemous_ht:
            return "polysemous filtering"
    lists = faiss.downcast_InvertedLists(top.invlists)
    if not isinstance(lists, (faiss.ArrayInvertedLists, faiss.OnDiskInvertedLists)):
        return f"inverted lists of type {type(lists).__name__}"
    return None


class IvfScan:
    """Search of a CPU ``IndexIVFPQ`` or ``IndexIVFFlat`` (``uncovered`` says which) by several rows at once.

    ``threads`` > 1 splits each search's lists into as many shares of about as many entries, each scanned on a thread
    of its own. The index's ``nprobe`` is read at each search.
    """

    def __init__(self, faiss: Any, index: Any, threads: int = 1) -> None:
        why = uncovered(faiss, index)
        if why is not None:
            raise ValueError(f"IvfScan cannot search this index: {why}")
        self.index = faiss.downcast_index(index)  # holds the lists the pointers below point into
        ivf = self.index
        self.d = int(ivf.d)
        self.nlist = int(ivf.nlist)
        self.pq = isinstance(ivf, faiss.IndexIVFPQ)
        lists = ivf.invlists
        code_size = int(ivf.code_size)
        self.sizes = np.array([lists.list_size(i) for i in range(self.nlist)], dtype=np.int64)
        self.code_at = np.zeros(self.nlist, dtype=np.int64)
        self.id_at = np.zeros(self.nlist, dtype=np.int64)
        for i in np.flatnonzero(self.sizes):
            n = int(self.sizes[i])
            self.code_at[i] = faiss.rev_swig_ptr(lists.get_codes(int(i)), n * code_size).ctypes.data
            self.id_at[i] = faiss.rev_swig_ptr(lists.get_ids(int(i)), n).ctypes.data
        if self.pq:
            pq = ivf.pq
            self.centroids = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub)
        self.threads = max(1, threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        # Compiles (or loads the cached kernels) here rather than in the first call.
        self.search(np.zeros((2, self.d), np.float32), 1)

    def assign(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's probed lists and their coarse scores, by the index's quantizer as FAISS's search assigns them
        (its ``nprobe``, at most its list count)."""
        nprobe = min(int(self.index.nprobe), self.nlist)
        coarse, assigned = self.index.quantizer.search(queries, nprobe)
        return coarse, assigned

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and ids of each query row's best ``k``, best first (FAISS's ``search`` contract)."""
        if queries.ndim != 2 or queries.shape[1] != self.d:
            raise ValueError(f"queries must be r x {self.d}, got shape {queries.shape}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        r = len(queries)
        coarse, assigned = self.assign(queries)
        width = -(-r // GROUP) * GROUP
        probed = assigned >= 0
        lists, inverse = np.unique(assigned[probed], return_inverse=True)
        probes = np.zeros((len(lists), width), dtype=np.bool_)
        dis0 = np.zeros((len(lists), width), dtype=np.float32)
        by_row = np.nonzero(probed)[0]
        probes[inverse, by_row] = True
        dis0[inverse, by_row] = coarse[probed]
        keep = self.sizes[lists] > 0
        lists, probes, dis0 = lists[keep], probes[keep], dis0[keep]
        padded = np.zeros((width, self.d), dtype=np.float32)
        padded[:r] = queries
        tables = _tables(padded, self.centroids) if self.pq else padded

        def share(span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
            a, b = span
            best = np.full((width, k), -np.inf, dtype=np.float32)
            rows = np.full((width, k), -1, dtype=np.int64)
            if self.pq:
                _scan_pq(self.code_at, self.id_at, self.sizes, lists[a:b], probes[a:b], dis0[a:b], tables, k, best,
                         rows)
            else:
                _scan_flat(self.code_at, self.id_at, self.sizes, lists[a:b], probes[a:b], tables, k, best, rows)
            return best, rows

        spans = _spans(self.sizes[lists], self.threads)
        pool = self._pool
        parts = [pool.submit(share, span) for span in spans[1:]] if pool else []
        heaps = [share(spans[0])] + [p.result() for p in parts]
        best = np.concatenate([h[0] for h in heaps], axis=1)[:r]
        rows = np.concatenate([h[1] for h in heaps], axis=1)[:r]
        order = np.argsort(-best, axis=1, kind="stable")[:, :k]
        scores = np.take_along_axis(best, order, axis=1)
        rows = np.take_along_axis(rows, order, axis=1)
        scores[rows < 0] = EMPTY
        return scores, rows

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _spans(sizes: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges of the lists whose sizes are ``sizes``, of about as many entries each (one list is
    never split: a range may be empty)."""
    if parts == 1 or len(sizes) == 0:
        return [(0, len(sizes))]
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="left")
    edges = [0, *(int(c) for c in cuts), len(sizes)]
    return [(edges[i], max(edges[i], edges[i + 1])) for i in range(parts)]
