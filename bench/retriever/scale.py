"""The retriever at an index size users run: millions of vectors in memory-mapped shards, real processes.

    PYTHONPATH=. python bench/retriever/scale.py [--rows 4000000] [--types flat,ivfpq] [--shards 1,2,4,8]
        [--concurrency 32,256] [--seconds 20] [--rounds 12] [--work DIR]

On the shipped 16,917 passages a shard's scan costs nothing and the query encoder is all a call costs.
Users search Wikipedia (21M passages). This bench builds a synthetic index of ``--rows`` random unit vectors
in the shipped encoder's dimension (384), with one planted nearest neighbour for every shipped question (the
question's own embedding moved to cosine 0.9; random rows reach about 0.3 against it, so the exact index must
rank the planted row first), as one FAISS file per index type: ``flat``, exact inner product as in the
papers, and ``ivfpq`` (the build's 64-byte codes; ``--ivf-lists`` lists of which ``--ivf-probes`` are
searched, the build's default share of 64 in 4,096), what users without the memory run. Each is split into
shards by ``ragr1 index import``'s code and served by real shard and router processes over gRPC (one FAISS
search thread per shard, the shards' default; files memory-mapped).

1. the scan in-process: one search of 1 to 96 query rows over the whole flat file on one thread, FAISS's
   own threshold for its matrix-product path against the shard's (``--blas-rows-per-thread``), the rates
   behind them, and from those a stated linear model of the wiki-18 sizes (extrapolated, not measured);
2. served, for each index type and shard count, twice: with the router's real encoder (the shipped
   all-MiniLM-L6-v2, onnx-int8) and with the same router given the questions' embeddings precomputed
   (``LookupEncoder``: no model runs), so that the encoder's cost is separated from the scan's:
   - answers checked: the share of queries whose first hit is the unsharded index's (the planted row in the
     exact index; the source file's own first hit in an IVF one);
   - 1 client: median latency of 1-question and 3-question calls, interleaved, and their ratio;
   - ``--concurrency`` callers calling with 3 questions back to back for ``--seconds``: calls/s, p50/p99,
     errors, the router's time per call (embed, fan-out, merge) and the CPU milliseconds per call of the
     router and of all shards together (their ``process_cpu_seconds_total``);
   and for the flat index on the first shard count, the same load with FAISS's own threshold
   (``--blas-rows-per-thread 0``: the shard before that setting). Ratios are against the first shard count
   with the real encoder, in the same run.

Nothing is simulated: the vectors are synthetic; the processes, sockets, files and encoder are real. The
machine's available memory and load are printed with each layout: a layout larger than the page cache can
hold is read from disk, which the figures then measure. Files live in ``--work`` (the sources kept for the
next run) or a temporary directory: rows x 1.6 KB for the flat source, as much again for one layout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.retriever.throughput import (
    QUERIES_PER_CALL,
    TOP_K,
    Cluster,
    Load,
    QueryFeed,
    load_retriever,
    metric,
    one_vs_three,
    router_process,
    shard_processes,
    stage_means,
    stage_scrape,
)
from ragr1.protocol.information import Passage
from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever import plan
from ragr1.services.retriever.client import AsyncRetrieverClient
from ragr1.services.retriever.config import ShardConfig
from ragr1.services.retriever.corpus import PassageStore, write_store
from ragr1.services.retriever.encoder import DEFAULT_BACKEND, DEFAULT_ENCODER, Encoder, preset
from ragr1.services.retriever.faiss_file import write_flat
from ragr1.services.retriever.importer import import_index
from ragr1.services.retriever.index import IndexSpec
from ragr1.shipped import all_questions

SEED = 20261127
CHUNK_ROWS = 1 << 17
# Cosine of a planted row to its question's embedding; a random unit vector's against any query is about
# N(0, 1/dim), whose maximum over millions of rows stays near 0.3 in 384 dimensions.
PLANTED_COSINE = 0.9
# The router's warm-up query (server.build_router_server), which the precomputed table must hold too.
WARM_UP = "warm-up"
GB = 1e9


# ---- the synthetic index ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Synthetic:
    rows: int
    dim: int
    questions: list[str]
    vectors: np.ndarray  # the questions' embeddings, as the index's encoder makes them
    planted: np.ndarray  # the row planted for each question


def passage_id(row: int) -> str:
    return f"row-{row}"


def plant(rows: int, count: int) -> np.ndarray:
    """Rows spread evenly over the index, so that every shard of every layout holds some."""
    if count > rows:
        raise ValueError(f"{count} planted rows do not fit in {rows} rows")
    return (np.arange(count, dtype=np.int64) * 2 + 1) * rows // (2 * count)


def planted_vectors(vectors: np.ndarray, seed: int) -> np.ndarray:
    """Each vector moved to cosine ``PLANTED_COSINE`` from where it was, in a random direction."""
    rng = np.random.default_rng([seed, 1])
    noise = rng.standard_normal(vectors.shape, dtype=np.float32)
    noise -= (noise * vectors).sum(axis=1, keepdims=True) * vectors  # orthogonal to the vector
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    sine = math.sqrt(1 - PLANTED_COSINE**2)
    return np.ascontiguousarray(PLANTED_COSINE * vectors + sine * noise, dtype=np.float32)


def random_unit(rows: int, dim: int, seed: Sequence[int]) -> np.ndarray:
    block = np.random.default_rng(seed).standard_normal((rows, dim), dtype=np.float32)
    block /= np.linalg.norm(block, axis=1, keepdims=True)
    return block


def chunks(data: Synthetic, seed: int) -> Iterator[np.ndarray]:
    """The index's rows in order, ``CHUNK_ROWS`` at a time: random unit vectors, the planted rows in place."""
    moved = planted_vectors(data.vectors, seed)
    for start in range(0, data.rows, CHUNK_ROWS):
        end = min(start + CHUNK_ROWS, data.rows)
        block = random_unit(end - start, data.dim, [seed, 0, start])
        inside = np.nonzero((data.planted >= start) & (data.planted < end))[0]
        block[data.planted[inside] - start] = moved[inside]
        yield block


def synthetic_store(rows: int, directory: Path) -> PassageStore:
    return write_store((Passage(passage_id(i), f"synthetic {i}", "") for i in range(rows)), directory, progress=False)


def available_gb() -> float:
    """MemAvailable: what the page cache can hold of the index without pushing other processes out."""
    import psutil

    return float(psutil.virtual_memory().available) / GB


def drop_cache(path: Path) -> None:
    """Asks the kernel to forget a file's cached pages, so that the layout being served keeps the memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def build_sources(data: Synthetic, specs: Sequence[IndexSpec], work: Path) -> dict[str, Path]:
    """One FAISS file per index type over all rows, reused when ``work`` already holds it for these rows."""
    import faiss

    stamp = {"rows": data.rows, "dim": data.dim, "seed": SEED, "questions": len(data.questions),
             "cosine": PLANTED_COSINE, "planted_sum": int(data.planted.sum()),
             "vectors": round(float(data.vectors.sum()), 1)}
    sources = {}
    for spec in specs:
        kind = spec.index_type
        path = work / f"source.{kind}.faiss"
        stamp_path = path.with_suffix(".json")
        spec_stamp = {**stamp, **dataclasses.asdict(spec)}
        if path.exists() and stamp_path.exists() and json.loads(stamp_path.read_text()) == spec_stamp:
            sources[kind] = path
            continue
        started = time.perf_counter()
        if kind == "flat":
            write_flat(path, data.dim, "ip", data.rows, chunks(data, SEED))
        else:
            index = faiss_index.new_index(faiss, spec, data.dim, data.rows)
            # On isotropic random vectors k-means finds no clusters to move to: rows drawn from the same
            # distribution serve as the centroids (k-means' own start), and FAISS then trains only the codes.
            ivf = faiss.extract_index_ivf(index)
            ivf.quantizer.add(random_unit(ivf.nlist, data.dim, [SEED, 2]))
            index.train(next(chunks(data, SEED)))  # the codebooks, on the first rows
            for block in chunks(data, SEED):
                index.add(block)
            ivf.nprobe = spec.nprobe  # kept in the file, and by the import in the shards' manifest
            faiss.write_index(index, str(path))
        drop_cache(path)
        stamp_path.write_text(json.dumps(spec_stamp))
        took = time.perf_counter() - started
        print(f"   {kind} source: {path.stat().st_size / GB:.2f} GB in {took:.0f} s", flush=True)
        sources[kind] = path
    return sources


def expected_first(data: Synthetic, kind: str, source: Path) -> list[str]:
    """The passage the unsharded index ranks first for each question's precomputed vector: its planted row in
    the exact index; in an IVF index, whatever the source file's own search finds (random vectors have no
    clusters, so its lists often miss the planted row: that says nothing of its recall on embeddings)."""
    if kind == "flat":
        return [passage_id(int(r)) for r in data.planted]
    import faiss

    index = faiss_index.read(faiss, str(source), kind, True)
    _, rows = index.search(data.vectors, 1)
    return [passage_id(int(r)) for r in rows[:, 0]]


def synthetic(rows: int, work: Path) -> tuple[Synthetic, PassageStore]:
    settings = preset(DEFAULT_ENCODER, DEFAULT_BACKEND)
    questions = all_questions()
    vectors = Encoder(settings, device="cpu", threads=1).encode_queries(questions)
    data = Synthetic(rows, int(vectors.shape[1]), questions, vectors, plant(rows, len(questions)))
    store_dir = work / "store"
    store = PassageStore(store_dir) if (store_dir / "store.json").exists() else None
    if store is None or len(store) != rows:
        store = synthetic_store(rows, store_dir)
    return data, store


# ---- 1. the scan in-process --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scan:
    rows: int
    faiss_ms: float | None  # None: skipped, longer than the cap
    shard_ms: float


def scan_costs(path: Path, batches: Sequence[int], rows_per_thread: int, cap_s: float) -> list[Scan]:
    """ms of one search of each batch size over the memory-mapped flat file on one thread, FAISS's own
    threshold against ``rows_per_thread``; best of two, interleaved (one run where longer than 2 s)."""
    import faiss

    faiss.omp_set_num_threads(1)
    index = faiss_index.read(faiss, str(path), "flat", True)
    default = faiss.cvar.distance_compute_blas_threshold
    queries = np.ascontiguousarray(index.reconstruct_n(0, max(batches)) + 0.01, dtype=np.float32)

    def timed(threshold_rows: int, n: int) -> float:
        if threshold_rows:
            faiss_index.set_blas_rows(faiss, threshold_rows, index.d)
        else:
            faiss.cvar.distance_compute_blas_threshold = default
        started = time.perf_counter()
        index.search(queries[:n], TOP_K)
        return time.perf_counter() - started

    one = timed(0, 1)  # also pages the file in
    one = timed(0, 1)
    out = []
    for n in batches:
        repeats = 2 if one * n < 2 else 1
        faiss_s = [timed(0, n) for _ in range(repeats)] if one * n <= cap_s else []
        shard_s = [timed(rows_per_thread, n) for _ in range(repeats)]
        out.append(Scan(n, min(faiss_s) * 1000 if faiss_s else None, min(shard_s) * 1000))
    faiss.cvar.distance_compute_blas_threshold = default
    return out


def print_scan(scans: Sequence[Scan], rows: int, dim: int, rows_per_thread: int) -> tuple[float, float]:
    """The table, and the rates of the linear model: bytes scanned per second by one thread (one row, one
    pass) and multiply-adds per second of the matrix product (the largest batch)."""
    print(f"   {'rows':>5} {'FAISS default ms':>16} {'shard ms':>9} {'ms/row':>8} {'speed-up':>8}")
    for s in scans:
        faiss_ms = f"{s.faiss_ms:16.1f}" if s.faiss_ms is not None else f"{'(skipped)':>16}"
        gain = f"{s.faiss_ms / s.shard_ms:7.2f}x" if s.faiss_ms is not None else f"{'':>8}"
        print(f"   {s.rows:5d} {faiss_ms} {s.shard_ms:9.1f} {s.shard_ms / s.rows:8.2f} {gain}")
    one = scans[0]
    bandwidth = rows * dim * 4 / (one.shard_ms / 1000)
    big = scans[-1]
    flops = 2 * rows * dim * big.rows / (big.shard_ms / 1000)
    print(
        f"   one thread: one row's pass reads {bandwidth / GB:.1f} GB/s; a batch of {big.rows} runs at "
        f"{flops / GB:.1f} GFLOP/s (blas from {rows_per_thread} rows per thread)"
    )
    return bandwidth, flops


def extrapolate(bandwidth: float, flops: float) -> None:
    """The linear model on wiki-18: time = a pass over the shard's vectors per query row (below the
    threshold) or the batch's arithmetic (above), per thread; stated as a model, not measured."""
    print("   extrapolated to wiki-18 (21,015,324 passages), one thread per shard, this machine's rates (a model):")
    for model, (dim, _, _) in plan.MODELS.items():
        if dim < 768:
            continue
        size = plan.WIKIPEDIA_PASSAGES * dim * 4
        one = size / bandwidth
        batch = 2 * plan.WIKIPEDIA_PASSAGES * dim * 96 / flops
        print(
            f"     {model} ({dim}-d, flat {size / GB:.0f} GB): 1 query {one:.1f} s per shard-thread, "
            f"96 queries batched {batch:.1f} s; shards for a 1-query pass under 1 s: {math.ceil(one):d}"
        )


# ---- 2. served ----------------------------------------------------------------------------------------------


class LookupEncoder:
    """The router's encoder replaced by a table of the questions' embeddings: no model runs."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self._rows = {t: i for i, t in enumerate(texts)}
        self._vectors = vectors

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        missing = [q for q in queries if q not in self._rows]
        if missing:
            raise KeyError(f"no precomputed vector for {missing[0]!r}")
        return self._vectors[[self._rows[q] for q in queries]]


def lookup_router(table: Path, flags: Sequence[str]) -> int:
    """``ragr1 serve retriever``'s router with ``LookupEncoder`` (run as this script's child process)."""
    from ragr1.services.common.commands import configure_logging
    from ragr1.services.common.config import add_arguments, from_args
    from ragr1.services.retriever.config import RouterConfig
    from ragr1.services.retriever.server import build_router_server

    parser = argparse.ArgumentParser(prog="lookup-router", add_help=False)
    add_arguments(parser, RouterConfig)
    config = from_args(RouterConfig, parser.parse_args(list(flags)))
    configure_logging(config.log_level)
    saved = np.load(table)
    encoder = LookupEncoder(list(saved["texts"]), saved["vectors"])

    async def serve() -> int:
        server = await build_router_server(config, encoder)
        return await server.serve()

    return asyncio.run(serve())


@dataclasses.dataclass
class Point:
    """One load measurement and what it cost each process."""

    load: Load
    stages: dict[str, float]
    router_cpu_ms: float  # per call
    shards_cpu_ms: float  # per call, all shards together


@dataclasses.dataclass
class Served:
    kind: str
    shards: int
    encoder: str  # "real" or "precomputed"
    one_ms: float = 0.0
    three_ms: float = 0.0
    agree: float = 0.0  # share of first hits equal to the unsharded index's
    points: dict[int, Point] = dataclasses.field(default_factory=dict)


def cpu_seconds(url: str) -> float:
    return metric(url, "process_cpu_seconds_total")[""]


def measure_load(cluster: Cluster, pool: Sequence[str], concurrency: int, seconds: float) -> Point:
    before = stage_scrape(cluster.metrics)
    cpu_before = [cpu_seconds(u) for u in [cluster.metrics, *cluster.shard_metrics]]
    load = asyncio.run(load_retriever(cluster.target, QueryFeed(pool), concurrency, seconds))
    cpu_after = [cpu_seconds(u) for u in [cluster.metrics, *cluster.shard_metrics]]
    after = stage_scrape(cluster.metrics)
    calls = max(load.calls + load.errors + 1, 1)  # +1: drive's warm-up call
    spent = [(b - a) * 1000 / calls for a, b in zip(cpu_before, cpu_after, strict=True)]
    return Point(load, stage_means(before[0], after[0], before[1], after[1]), spent[0], sum(spent[1:]))


def agreement(target: str, data: Synthetic, expected: Sequence[str], calls: int, concurrency: int) -> float:
    """Share of queries whose first hit is ``expected``'s, over ``calls`` calls of 3 questions."""
    order = np.random.default_rng(SEED).permutation(len(data.questions))[: calls * QUERIES_PER_CALL]
    groups = [order[i : i + QUERIES_PER_CALL] for i in range(0, len(order), QUERIES_PER_CALL)]

    async def run() -> float:
        client = AsyncRetrieverClient(target, timeout=300)
        gate = asyncio.Semaphore(concurrency)
        found = 0

        async def one(rows: np.ndarray) -> None:
            nonlocal found
            async with gate:
                reply = await client.search([data.questions[r] for r in rows], TOP_K)
            for r, result in zip(rows, reply.results, strict=True):
                found += bool(result.passages) and result.passages[0].id == expected[int(r)]

        try:
            await asyncio.gather(*(one(g) for g in groups))
        finally:
            await client.close()
        return found / len(order)

    return asyncio.run(run())


def measure(
    cluster: Cluster, served: Served, data: Synthetic, expected: Sequence[str], args: argparse.Namespace, label: str
) -> Served:
    served.agree = agreement(cluster.target, data, expected, args.checked_calls, 16)
    served.one_ms, served.three_ms = one_vs_three(cluster.target, data.questions, args.rounds)
    print(
        f"   {label:<34} first hit as unsharded {served.agree:6.3f}; 1 client: 1 question {served.one_ms:8.1f} ms, "
        f"3 questions {served.three_ms:8.1f} ms, ratio {served.three_ms / served.one_ms:5.2f}",
        flush=True,
    )
    for c in args.levels:
        served.points[c] = point = measure_load(cluster, data.questions, c, args.seconds)
        print("   " + point_row(f"{label} c={c}", point), flush=True)
    return served


def point_row(name: str, p: Point) -> str:
    r = p.load
    errors = f"{r.errors}" + (f" ({r.error_kinds})" if r.errors else "")
    split = " ".join(f"{p.stages.get(s, float('nan')):7.1f}" for s in ("embed", "fanout", "merge"))
    return (
        f"{name:<40} {r.calls_per_s:7.2f} {r.p50_ms:9.1f} {r.p99_ms:9.1f} {r.calls:6d} {errors:>6}  {split}  "
        f"{p.router_cpu_ms:7.1f} {p.shards_cpu_ms:8.1f}"
    )


@contextmanager
def layout(source: Path, store: PassageStore, shards: int, work: Path) -> Iterator[Path]:
    """``source`` imported as ``shards`` shards (the importer's code), deleted afterwards."""
    out = work / f"layout-{source.stem}-{shards}"
    shutil.rmtree(out, ignore_errors=True)
    settings = preset(DEFAULT_ENCODER, DEFAULT_BACKEND)
    import_index([source], out, settings, num_shards=shards, store=store, progress=False)
    drop_cache(source)
    try:
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


def serve_all(args: argparse.Namespace, data: Synthetic, store: PassageStore, sources: dict[str, Path],
              work: Path) -> list[Served]:
    table = work / "precomputed.npz"
    np.savez(table, texts=np.asarray([*data.questions, WARM_UP]),
             vectors=np.concatenate([data.vectors, data.vectors[:1]]))
    lookup = [sys.executable, str(Path(__file__).resolve()), "--lookup-router", str(table)]
    deadline = ("--timeout-s", str(args.deadline_s))
    shard_flags = ["--checksum", "off"]  # a background checksum would read the whole file while measuring
    print(
        f"   {'':<40} {'calls/s':>7} {'p50 ms':>9} {'p99 ms':>9} {'calls':>6} {'errors':>6}  "
        f"{'embed':>7} {'fanout':>7} {'merge':>7}  {'router':>7} {'shards':>8}  (ms per call; CPU ms per call)"
    )
    results = []
    for kind, source in sources.items():
        expected = expected_first(data, kind, source)
        for n in args.shard_counts:
            with layout(source, store, n, work) as index_dir:
                print(f"   ({kind}, {n} shard(s): memory available {available_gb():.1f} GB, "
                      f"load average {os.getloadavg()[0]:.1f})", flush=True)
                with shard_processes(index_dir, work, shard_flags) as shards:
                    for encoder, command in (("real", ()), ("precomputed", lookup)):
                        with router_process(index_dir, work, shards, *deadline, command=command) as cluster:
                            label = f"{kind}, {n} shard{'s' if n > 1 else ''}, {encoder}"
                            results.append(measure(cluster, Served(kind, n, encoder), data, expected, args, label))
                if kind != "flat" or n != args.shard_counts[0]:
                    continue
                # The same shards with FAISS's own threshold for its matrix product: the shard before the fix.
                before = [*shard_flags, "--blas-rows-per-thread", "0"]
                with shard_processes(index_dir, work, before) as shards, router_process(
                    index_dir, work, shards, *deadline, command=lookup
                ) as cluster:
                    c = args.levels[0]
                    point = measure_load(cluster, data.questions, c, args.seconds)
                    print("   " + point_row(f"{kind}, {n} shard, precomputed, FAISS's threshold c={c}", point))
                    results.append(Served(kind, n, "precomputed, FAISS's threshold", points={c: point}))
    return results


def ratios(results: Sequence[Served], levels: Sequence[int]) -> None:
    print("\nratios (against one shard with the real encoder, same index type, same run)")
    for kind in dict.fromkeys(r.kind for r in results):
        base = next(r for r in results if r.kind == kind and r.encoder == "real")
        for r in (r for r in results if r.kind == kind):
            cells = []
            if r.one_ms:
                cells.append(f"3q/1q {r.three_ms / r.one_ms:5.2f}, 1q latency x{r.one_ms / base.one_ms:5.2f}")
            for c in levels:
                if c in r.points:
                    p, b = r.points[c].load, base.points[c].load
                    calls, p99 = p.calls_per_s / b.calls_per_s, p.p99_ms / b.p99_ms
                    cells.append(f"c={c}: calls/s x{calls:5.2f}, p99 x{p99:5.2f}")
            print(f"  {kind}, {r.shards} shard(s), {r.encoder:<31} " + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000, help="vectors in the index")
    parser.add_argument("--types", default="flat,ivfpq", help="index types, comma-separated")
    parser.add_argument("--shards", default="1,2,4,8", help="shard counts, comma-separated")
    parser.add_argument("--concurrency", default="32,256", help="concurrent callers")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each load measurement")
    parser.add_argument("--rounds", type=int, default=12, help="1-client rounds (a 1- and a 3-question call each)")
    parser.add_argument("--checked-calls", type=int, default=64, help="calls of 3 questions whose answers are checked")
    parser.add_argument("--ivf-lists", type=int, default=1024, help="ivfpq: inverted lists")
    parser.add_argument("--ivf-probes", type=int, default=16, help="ivfpq: lists searched")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="the router's deadline (--timeout-s)")
    parser.add_argument("--scan-batches", default="1,2,3,4,8,32,96", help="in-process scan: query rows per search")
    parser.add_argument("--scan-cap-s", type=float, default=15.0, help="in-process scan: skip longer searches")
    parser.add_argument("--work", type=Path, default=None, help="keep the sources here and reuse them next time")
    if sys.argv[1:2] == ["--lookup-router"]:
        # The router's own flags follow, some named like this script's (--shards): not parsed here.
        sys.exit(lookup_router(Path(sys.argv[2]), sys.argv[3:]))
    args = parser.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    args.shard_counts = [int(s) for s in args.shards.split(",")]
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        run(args, args.work)
        return
    with tempfile.TemporaryDirectory(prefix="retriever-scale-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, work: Path) -> None:
    import faiss

    # Building and the in-process scan on one thread: on a shared host every OpenMP region of two threads
    # waits for the one that is not running (as the shards do by default).
    faiss.omp_set_num_threads(1)
    types = args.types.split(",")
    rows_per_thread = ShardConfig.blas_rows_per_thread
    print(f"{args.rows:,} rows; index types {', '.join(types)}; shards {args.shard_counts}; "
          f"{QUERIES_PER_CALL} questions per call, top-{TOP_K}; {os.cpu_count()} CPUs; "
          f"memory available {available_gb():.1f} GB; load average {os.getloadavg()[0]:.1f}")
    started = time.perf_counter()
    data, store = synthetic(args.rows, work)
    print(f"   {len(data.questions)} questions embedded and planted; {data.dim}-d; store of {len(store):,} passages")
    specs = [IndexSpec(t, nlist=args.ivf_lists, nprobe=args.ivf_probes) if t != "flat" else IndexSpec(t) for t in types]
    sources = build_sources(data, specs, work)
    print(f"   sources ready after {time.perf_counter() - started:.0f} s\n")
    if "flat" in sources:
        size = args.rows * data.dim * 4
        print(f"1. the scan in-process: one search over the whole flat file ({size / GB:.2f} GB), one thread")
        scans = scan_costs(sources["flat"], [int(b) for b in args.scan_batches.split(",")], rows_per_thread,
                           args.scan_cap_s)
        drop_cache(sources["flat"])
        bandwidth, flops = print_scan(scans, args.rows, data.dim, rows_per_thread)
        extrapolate(bandwidth, flops)
        print()
    print("2. served (router + shard processes over gRPC, one search thread per shard)")
    results = serve_all(args, data, store, sources, work)
    ratios(results, args.levels)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
