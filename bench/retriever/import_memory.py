"""``ragr1 index import`` of a flat index of a few GB in Search-R1's layout: time and peak memory.

    python bench/retriever/import_memory.py [--rows 650000] [--dim 768] [--shards 4] [--hnsw-rows 20000]

Writes, into a temporary directory on the disk of ``--tmp`` (deleted at the end), a flat
inner-product index of ``--rows`` synthetic unit vectors of ``--dim`` dimensions (e5-base's 768 by
default: 650,000 rows is 2.0 GB) and a ``contents`` JSONL corpus of as many lines, then, each in its
own process so that peak resident memory (``ru_maxrss`` of the child) is its own:

1. the baseline: ``faiss.read_index`` of the whole file, as Search-R1's retrieval server opens it;
2. ``ragr1 index import --num-shards --shards``, as a user runs it.

It prints the index's size, each one's time and peak memory, and the ratios (import peak / index
size, import peak / baseline peak). With ``--hnsw-rows``, it also imports an HNSW32 index of that
many vectors into the same number of shards, to price the per-shard graph rebuild (vectors/s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ragr1.services.retriever.faiss_file import write_flat
from ragr1.services.retriever.importer import DEFAULT_CHUNK_ROWS

BASELINE = """
import sys, faiss
index = faiss.read_index(sys.argv[1])
assert index.ntotal == int(sys.argv[2])
"""
# Runs `ragr1 ARGS` or the script WHAT, then writes its own peak resident bytes (VmHWM) to REPORT.
PEAK_WRAPPER = """
import atexit, runpy, sys
report, what = sys.argv[1], sys.argv[2]
def hwm():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(report, "w") as f:
        f.write(str(kb * 1024))
atexit.register(hwm)
sys.argv = [what, *sys.argv[3:]]
if what == "ragr1":
    runpy.run_module("ragr1", run_name="__main__", alter_sys=True)
else:
    exec(compile(open(what).read(), what, "exec"), {"__name__": "__main__"})
"""


def synthetic(rows: int, dim: int, chunk: int, seed: int = 0) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    for start in range(0, rows, chunk):
        x = rng.standard_normal((min(chunk, rows - start), dim), dtype=np.float32)
        yield x / np.linalg.norm(x, axis=1, keepdims=True)


def write_corpus(path: Path, rows: int) -> None:
    with open(path, "w") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\nsynthetic passage {i}'}) + "\n")


def run_child(root: Path, what: str, args: list[str]) -> tuple[float, int]:
    """Seconds and peak resident bytes of one child process, as the child itself reads its ``VmHWM``
    at exit: a forked child's ``ru_maxrss`` starts from its parent's resident size, this one's does not."""
    report = root / "peak"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", PEAK_WRAPPER, str(report), what, *args], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, int(report.read_text())


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=650_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--hnsw-rows", type=int, default=20_000, help="0 skips the HNSW rebuild measurement")
    parser.add_argument("--tmp", default=None, help="where the temporary directory goes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ragr1-import-bench-", dir=args.tmp))
    try:
        source = root / "e5_Flat.index"
        started = time.perf_counter()
        write_flat(source, args.dim, "ip", args.rows, synthetic(args.rows, args.dim, 50_000))
        write_corpus(root / "wiki.jsonl", args.rows)
        size = source.stat().st_size
        written = time.perf_counter() - started
        print(f"source: {args.rows:,} x {args.dim} flat IP, {gb(size)} ({written:.1f} s to write)")
        (root / "baseline.py").write_text(BASELINE)
        import_s, import_peak = run_child(root, "ragr1", [
            "index", "import", "--input", str(source), "--corpus", str(root / "wiki.jsonl"),
            "--out", str(root / "imported"),
            "--num-shards", str(args.shards), "--encoder", "intfloat/e5-base-v2",
            "--chunk-rows", str(args.chunk_rows),
        ])
        base_s, base_peak = run_child(root, str(root / "baseline.py"), [str(source), str(args.rows)])
        shards = sorted((root / "imported").glob("shard-*.faiss"))
        largest = max(p.stat().st_size for p in shards)
        print(f"baseline faiss.read_index (Search-R1's server): {base_s:6.1f} s, peak {gb(base_peak)}")
        print(f"ragr1 index import, {args.shards} shards:        {import_s:6.1f} s, peak {gb(import_peak)} "
              f"(corpus ingest included; chunk {args.chunk_rows} rows = {gb(args.chunk_rows * args.dim * 4)})")
        print(f"import peak / index size: {import_peak / size:.3f}; / largest shard ({gb(largest)}): "
              f"{import_peak / largest:.3f}; / baseline peak: {import_peak / base_peak:.3f}")
        print(f"import throughput: {size / import_s / 1e6:.0f} MB/s of index")
        if args.hnsw_rows:
            import faiss

            x = np.concatenate(list(synthetic(args.hnsw_rows, args.dim, 50_000, seed=1)))
            hnsw = faiss.IndexHNSWFlat(args.dim, 32, faiss.METRIC_INNER_PRODUCT)
            started = time.perf_counter()
            hnsw.add(x)
            source_build = time.perf_counter() - started
            faiss.write_index(hnsw, str(root / "hnsw.index"))
            write_corpus(root / "hnsw.jsonl", args.hnsw_rows)
            del hnsw, x
            _, peak = run_child(root, "ragr1", [
                "index", "import", "--input", str(root / "hnsw.index"),
                "--corpus", str(root / "hnsw.jsonl"), "--out", str(root / "hnsw-imported"),
                "--num-shards", str(args.shards), "--encoder", "intfloat/e5-base-v2",
            ])
            # The import's own time (import.json), without the process start.
            seconds = json.loads((root / "hnsw-imported" / "import.json").read_text())["seconds"]
            print(f"HNSW32 import of {args.hnsw_rows:,} x {args.dim} into {args.shards} shards: {seconds:.1f} s "
                  f"({args.hnsw_rows / seconds:,.0f} vectors/s, graphs rebuilt; building the source graph in one "
                  f"index took {source_build:.1f} s: ratio {seconds / source_build:.2f}); peak {gb(peak)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
