"""A flat index's exact search of several query rows in one pass over its vectors (CPU).

Below its matrix-product threshold FAISS searches a flat index a row at a time, each row a full pass over the
vectors: the three queries of a multi-query call read a shard's vectors three times, and at millions of vectors
that memory traffic is the call's cost. Its matrix-product path reads them once but, for a handful of rows, packs
every block of vectors for a matrix product too skinny to pay for it. This scan reads each vector once for all
rows: it walks the vectors in blocks small enough to stay in the core's cache, and scores a block against the
rows in groups of ``GROUP`` (one accumulator per row of the group, so that the vector's elements are loaded once
per group and the rows' from the cache), keeping each row's best ``k`` in a heap. Its compiled kernel (numba)
releases the GIL, so that a shard with more than one search thread splits its vectors among them.

Scores are the index's: inner products, or squared L2 distances (lower is better), as FAISS returns them, with
row -1 where the index has fewer than ``k`` vectors.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Any

import numpy as np
from numba import njit

# Rows scored together against a vector: four accumulators fit beside the vector's and the rows' registers.
GROUP = 4
# Vectors per block: 256 x 384 float32 stay in a core's L2 cache while each group of rows scores them.
BLOCK = 256
METRICS = ("ip", "l2")


_jit = njit(fastmath=True, nogil=True)


@_jit
def _push(best: np.ndarray, rows: np.ndarray, q: int, score: float, row: int, k: int) -> None:
    # Replaces the heap's smallest score (its root) and sifts the new one down.
    i = 0
    while True:
        c = 2 * i + 1
        if c >= k:
            break
        if c + 1 < k and best[q, c + 1] < best[q, c]:
            c += 1
        if score <= best[q, c]:
            break
        best[q, i] = best[q, c]
        rows[q, i] = rows[q, c]
        i = c
    best[q, i] = score
    rows[q, i] = row


@_jit
def _scan(vectors: np.ndarray, norms: np.ndarray, queries: np.ndarray, k: int, l2: bool, best: np.ndarray,
          rows: np.ndarray, first_row: int) -> None:
    # queries: groups of GROUP rows, the last of them GROUP or GROUP - 1 rows (``_padded``): three accumulators
    # where a call of three queries needs no fourth. best/rows: a min-heap per row of scores where higher is better
    # (for L2, 2 x.q - |x|^2: the distance less |q|^2, which ranks alike).
    n, d = vectors.shape
    r = queries.shape[0]
    for b0 in range(0, n, BLOCK):
        b1 = min(n, b0 + BLOCK)
        for g in range(0, r, GROUP):
            wide = r - g >= GROUP
            for j in range(b0, b1):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                s2 = np.float32(0.0)
                s3 = np.float32(0.0)
                if wide:
                    for t in range(d):
                        x = vectors[j, t]
                        s0 += x * queries[g, t]
                        s1 += x * queries[g + 1, t]
                        s2 += x * queries[g + 2, t]
                        s3 += x * queries[g + 3, t]
                else:
                    for t in range(d):
                        x = vectors[j, t]
                        s0 += x * queries[g, t]
                        s1 += x * queries[g + 1, t]
                        s2 += x * queries[g + 2, t]
                if l2:
                    s0 = 2 * s0 - norms[j]
                    s1 = 2 * s1 - norms[j]
                    s2 = 2 * s2 - norms[j]
                    s3 = 2 * s3 - norms[j]
                row = first_row + j
                if s0 > best[g, 0]:
                    _push(best, rows, g, s0, row, k)
                if s1 > best[g + 1, 0]:
                    _push(best, rows, g + 1, s1, row, k)
                if s2 > best[g + 2, 0]:
                    _push(best, rows, g + 2, s2, row, k)
                if wide and s3 > best[g + 3, 0]:
                    _push(best, rows, g + 3, s3, row, k)


def _padded(queries: np.ndarray) -> np.ndarray:
    """``queries`` with zero rows after them, so that they split into groups of GROUP rows but the last, which may
    be GROUP - 1."""
    r, d = queries.shape
    width = r if r % GROUP in (0, GROUP - 1) else r + GROUP - 1 - r % GROUP
    out = np.zeros((width, d), dtype=np.float32)
    out[:r] = queries
    return out


def _norms(vectors: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Each vector's squared norm, a chunk at a time (a memory-mapped index is not read whole into memory)."""
    out = np.empty(len(vectors), dtype=np.float32)
    for start in range(0, len(vectors), chunk):
        part = vectors[start : start + chunk]
        out[start : start + chunk] = np.einsum("ij,ij->i", part, part)
    return out


# Compiled on first use (about a second) and cached on disk where numba can write (beside this module, or its
# user-wide cache directory); a read-only image without either compiles at each start instead of failing.
for _compiled in (_push, _scan):
    with contextlib.suppress(RuntimeError, OSError):
        _compiled.enable_caching()


class FlatScan:
    """Exact search of ``vectors`` (n x d float32, memory-mapped or not; not copied) by ``metric``.

    ``threads`` > 1 splits the vectors into as many contiguous ranges, each scanned on a thread of its own.
    """

    def __init__(self, vectors: np.ndarray, metric: str, threads: int = 1) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if vectors.ndim != 2 or vectors.dtype != np.float32 or not vectors.flags.c_contiguous:
            raise ValueError("vectors must be a C-contiguous n x d float32 array")
        self.vectors = vectors
        self.l2 = metric == "l2"
        # L2 ranks as 2 x.q - |x|^2, inner products less each vector's squared norm: its norms read once, here.
        self.norms = _norms(vectors) if self.l2 else np.zeros(0, dtype=np.float32)
        n = len(vectors)
        parts = max(1, min(threads, n))
        self._ranges = [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]
        self._pool = concurrent.futures.ThreadPoolExecutor(parts - 1) if parts > 1 else None
        # Compiles (or loads the cached kernel) here rather than in the first call.
        self._scan_range(np.zeros((GROUP, vectors.shape[1]), np.float32), 1, 0, min(n, 1))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and rows of each query row's best ``k``, best first (FAISS's ``search`` contract)."""
        d = self.vectors.shape[1]
        if queries.ndim != 2 or queries.shape[1] != d:
            raise ValueError(f"queries must be r x {d}, got shape {queries.shape}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        r = len(queries)
        padded = _padded(np.ascontiguousarray(queries, dtype=np.float32))
        pool = self._pool
        parts = [pool.submit(self._scan_range, padded, k, *span) for span in self._ranges[1:]] if pool else []
        start, end = self._ranges[0]
        heaps = [self._scan_range(padded, k, start, end)] + [p.result() for p in parts]
        best = np.concatenate([h[0] for h in heaps], axis=1)[:r]
        rows = np.concatenate([h[1] for h in heaps], axis=1)[:r]
        order = np.argsort(-best, axis=1, kind="stable")[:, :k]
        best = np.take_along_axis(best, order, axis=1)
        rows = np.take_along_axis(rows, order, axis=1)
        if self.l2:  # FAISS's squared distances: |q|^2 - (2 x.q - |x|^2)
            scores = np.einsum("ij,ij->i", queries, queries)[:, None].astype(np.float32) - best
            scores[rows < 0] = np.inf
        else:
            scores = best
            scores[rows < 0] = -np.inf
        return scores, rows

    def _scan_range(self, padded: np.ndarray, k: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        best = np.full((len(padded), k), -np.inf, dtype=np.float32)
        rows = np.full((len(padded), k), -1, dtype=np.int64)
        _scan(self.vectors[start:end], self.norms[start:end] if self.l2 else self.norms, padded, k, self.l2, best,
              rows, start)
        return best, rows

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def flat_vectors(faiss: Any, index: Any) -> np.ndarray:
    """A CPU ``IndexFlat``'s vectors as an n x d array over the index's own memory (its memory map when the
    file was mapped): no copy, valid while ``index`` lives."""
    n, d = int(index.ntotal), int(index.d)
    if n == 0:
        return np.zeros((0, d), dtype=np.float32)
    return np.asarray(faiss.rev_swig_ptr(index.get_xb(), n * d)).reshape(n, d)
