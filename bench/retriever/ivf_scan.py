"""An IVF-PQ shard's search of 1, 2 and 3 query rows in-process, on one thread: FAISS's ``index.search`` (each row's
probed lists scanned for that row alone) against the shard's one visit of the union of the rows' lists
(``ivf_scan.IvfScan``), on the same rows, alternated.

    PYTHONPATH=. python bench/retriever/ivf_scan.py [--rows 300000] [--lists 1024] [--probes 16,64] [--pq-m 64]
        [--repeats 200] [--work DIR]

The index: ``--rows`` random unit vectors in the shipped encoder's 384 dimensions, ``IVF{lists},PQ{m}x8`` by inner
product (what ``ragr1 index build`` makes), written to a file and memory-mapped as a shard opens it. Its coarse
centroids are random rows and its PQ codebooks residuals of random rows (k-means' own starting points: on isotropic
vectors k-means finds no clusters to move to, and what the codes mean changes nothing that either search costs).
The rows of a call are (a) independent random queries, and (b) related ones: three noisy copies of one query at
cosine ``scale.PLANTED_COSINE`` to it, as a question's paraphrases are; each case prints the lists the rows probe
together, the union's size (the lists the one visit reads), the median ms of each way over ``--repeats`` calls
alternated, and their ratio. ``scale.py`` runs the same measure on its IVF-PQ source (trained) at its largest size.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.retriever import scale
from ragr1.services.retriever import index as faiss_index

SEED = 20261203
DIM = 384
TOP_K = 10
ROW_COUNTS = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class Case:
    nprobe: int
    kind: str  # "independent" or "related"
    rows: int
    lists: float  # mean lists probed by the rows together (with repeats)
    union: float  # mean distinct lists among them
    faiss_ms: float
    scan_ms: float


def build(path: Path, rows: int, lists: int, pq_m: int) -> None:
    """The synthetic IVF-PQ file (see the module's docstring), in chunks of ``scale.CHUNK_ROWS``."""
    import faiss

    index = faiss.index_factory(DIM, f"IVF{lists},PQ{pq_m}x8", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.downcast_index(index)
    centroids = scale.random_unit(lists, DIM, [SEED, 1])
    ivf.quantizer.add(centroids)
    sample = scale.random_unit(ivf.pq.ksub, DIM, [SEED, 2])
    _, nearest = ivf.quantizer.search(sample, 1)
    residuals = sample - centroids[nearest[:, 0]]
    books = residuals.reshape(ivf.pq.ksub, pq_m, ivf.pq.dsub).transpose(1, 0, 2)
    faiss.copy_array_to_vector(np.ascontiguousarray(books).ravel(), ivf.pq.centroids)
    ivf.is_trained = True
    for start in range(0, rows, scale.CHUNK_ROWS):
        index.add(scale.random_unit(min(scale.CHUNK_ROWS, rows - start), DIM, [SEED, 3, start]))
    faiss.write_index(index, str(path))


def calls(kind: str, rows: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` calls of ``rows`` query rows each: independent random unit vectors, or noisy copies of one."""
    out = []
    for i in range(count):
        if kind == "independent":
            out.append(scale.random_unit(rows, DIM, [seed, 4, rows, i]))
        else:
            base = np.repeat(scale.random_unit(1, DIM, [seed, 5, rows, i]), rows, axis=0)
            out.append(scale.planted_vectors(base, seed + i))
    return out


def measure(path: Path, probes: Sequence[int], repeats: int) -> list[Case]:
    """Each case's lists and the median ms of each way over ``repeats`` calls, alternated, one thread."""
    import faiss

    from ragr1.services.retriever.ivf_scan import IvfScan

    faiss.omp_set_num_threads(1)
    index = faiss_index.read(faiss, str(path), "ivfpq", True)
    ivf = faiss.extract_index_ivf(index)
    scan = IvfScan(faiss, index, 1)
    out = []
    try:
        for nprobe in probes:
            ivf.nprobe = nprobe
            for kind in ("independent", "related"):
                for rows in ROW_COUNTS:
                    if kind == "related" and rows == 1:
                        continue
                    batch = calls(kind, rows, repeats, SEED)
                    for q in batch[:3]:  # warm: the lists' pages, the caches
                        index.search(q, TOP_K)
                        scan.search(q, TOP_K)
                    faiss_s, scan_s, probed, union = [], [], [], []
                    for q in batch:
                        started = time.perf_counter()
                        index.search(q, TOP_K)
                        middle = time.perf_counter()
                        scan.search(q, TOP_K)
                        faiss_s.append(middle - started)
                        scan_s.append(time.perf_counter() - middle)
                        assigned = scan.assign(q)[1]
                        probed.append(assigned.size)
                        union.append(len(np.unique(assigned)))
                    out.append(Case(nprobe, kind, rows, float(np.mean(probed)), float(np.mean(union)),
                                    float(np.median(faiss_s)) * 1000, float(np.median(scan_s)) * 1000))
    finally:
        scan.close()
    return out


def print_cases(cases: Sequence[Case]) -> None:
    print(f"   {'nprobe':>6} {'rows':<13} {'lists':>6} {'union':>6} {'faiss ms':>9} {'one visit ms':>12} "
          f"{'one visit / faiss':>17}")
    for c in cases:
        print(f"   {c.nprobe:6d} {c.rows} {c.kind:<11} {c.lists:6.1f} {c.union:6.1f} {c.faiss_ms:9.3f} "
              f"{c.scan_ms:12.3f} {c.scan_ms / c.faiss_ms:16.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="vectors in the index")
    parser.add_argument("--lists", type=int, default=1024, help="inverted lists")
    parser.add_argument("--probes", default="16,64", help="nprobe values, comma-separated")
    parser.add_argument("--pq-m", type=int, default=64, help="bytes per code")
    parser.add_argument("--repeats", type=int, default=200, help="calls of each case, each way")
    parser.add_argument("--work", type=Path, default=None, help="keep the index file here and reuse it")
    args = parser.parse_args()
    probes = [int(p) for p in args.probes.split(",")]
    with tempfile.TemporaryDirectory(prefix="ivf-scan-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        path = work / f"ivfpq-{args.rows}-{args.lists}-{args.pq_m}.faiss"
        if not path.exists():
            started = time.perf_counter()
            build(path, args.rows, args.lists, args.pq_m)
            print(f"   built {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
        print(f"{args.rows:,} vectors, IVF{args.lists},PQ{args.pq_m}x8 inner product, memory-mapped, one thread, "
              f"top-{TOP_K}; median of {args.repeats} calls each way, alternated")
        print_cases(measure(path, probes, args.repeats))


if __name__ == "__main__":
    main()
