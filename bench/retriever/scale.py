"""The retriever at an index size users run: millions of vectors in memory-mapped shards, real processes.

    PYTHONPATH=. python bench/retriever/scale.py [--rows 1000000,3000000] [--types flat,ivfpq] [--shards 2]
        [--encoders real,precomputed] [--concurrency 32,256] [--seconds 8] [--rounds 12] [--work DIR]

On the shipped 16,917 passages a shard's scan costs nothing and the query encoder is all a call costs.
Users search Wikipedia (21M passages). This bench builds, for each ``--rows``, a synthetic index of random unit
vectors in the shipped encoder's dimension (384), with one planted nearest neighbour for every shipped question
(the question's own embedding moved to cosine 0.9; random rows reach about 0.3 against it, so the exact index
must rank the planted row first), as one FAISS file per index type: ``flat``, exact inner product as in the
papers, and ``ivfpq`` (the build's 64-byte codes; ``--ivf-lists`` lists of which ``--ivf-probes`` are searched,
the build's default share of 64 in 4,096), what users without the memory run. Each is split into shards by
``ragr1 index import``'s code and served by real shard and router processes over gRPC (one FAISS search thread
per shard, the shards' default; files memory-mapped).

1. the scan in-process, on the largest flat file: one search of 1 to 32 query rows on one thread by each of the
   three ways a flat shard can score a batch: FAISS's pass over the vectors per row (its own path below its
   matrix-product threshold), one matrix product (BLAS), and the shard's one pass for all rows
   (``scan.FlatScan``); the rates behind them, and from those a stated linear model of the wiki-18 sizes
   (extrapolated, not measured);
2. served, for each size, index type and shard count, with the router's real encoder (the shipped
   all-MiniLM-L6-v2, onnx-int8) and, with ``--encoders``, the same router given the questions' embeddings
   precomputed (``LookupEncoder``: no model runs), so that the encoder's cost is separated from the scan's:
   - answers checked: the share of queries whose first hit is the unsharded index's (the planted row in the
     exact index; the source file's own first hit in an IVF one), and recall@10 of the planted neighbours (the
     share whose planted row is among the 10 hits: 1 for an exact index);
   - 1 client: median latency of 1-, 2- and 3-question calls, interleaved, and their ratio to the 1-question call;
   - ``--concurrency`` callers calling with 3 questions back to back for ``--seconds``: calls/s, p50/p99,
     errors, the router's time per call (embed, fan-out, merge) and the CPU milliseconds per call of the
     router and of all shards together (their ``process_cpu_seconds_total``);
   and for each flat layout the baseline in the same run: the same shards as they searched before the one-pass
   scan (``--no-blocked-scan --blas-rows-per-thread 4``: a pass per row under 4 rows), real encoder, 1 client
   and the first concurrency. Ratios are against that baseline.

Nothing is simulated: the vectors are synthetic; the processes, sockets, files and encoder are real. The
machine's available memory and load are printed with each layout: a layout larger than the page cache can
hold is read from disk, which the figures then measure. Files live in ``--work`` (the sources kept for the
next run) or a temporary directory: rows x 1.6 KB for the flat source, as much again for one layout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.retriever.throughput import (
    QUERIES_PER_CALL,
    TOP_K,
    Cluster,
    Load,
    QueryFeed,
    baseline_search,
    interleaved,
    load_retriever,
    metric,
    router_process,
    shard_processes,
    stage_means,
    stage_scrape,
)
from ragr1.protocol.information import Passage
from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever import plan
from ragr1.services.retriever.client import AsyncRetrieverClient, RetrieverClient
from ragr1.services.retriever.corpus import PassageStore, write_store
from ragr1.services.retriever.encoder import DEFAULT_BACKEND, DEFAULT_ENCODER, Encoder, preset
from ragr1.services.retriever.faiss_file import write_flat
from ragr1.services.retriever.importer import import_index
from ragr1.services.retriever.index import IndexSpec
from ragr1.services.retriever.scan import FlatScan, flat_vectors
from ragr1.shipped import all_questions

SEED = 20261127
CHUNK_ROWS = 1 << 17
# Cosine of a planted row to its question's embedding; a random unit vector's against any query is about
# N(0, 1/dim), whose maximum over millions of rows stays near 0.3 in 384 dimensions.
PLANTED_COSINE = 0.9
# The router's warm-up query (server.build_router_server), which the precomputed table must hold too.
WARM_UP = "warm-up"
GB = 1e9
RECALL_K = 10
# Questions per call at 1 client: the ratio of each to the 1-question call is what multi-query search costs.
CALL_SIZES = (1, 2, 3)
# The flat shard as it searched before the one-pass scan: a pass over the vectors per row under 4 rows a thread.
BEFORE_SCAN = ("--no-blocked-scan", "--blas-rows-per-thread", "4")


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


SCAN_PATHS = ("pass per row", "matrix product", "one pass")


@dataclasses.dataclass(frozen=True)
class Scan:
    rows: int
    ms: dict[str, float]  # by SCAN_PATHS; a path missing was skipped (longer than the cap)


def scan_costs(path: Path, batches: Sequence[int], cap_s: float) -> list[Scan]:
    """ms of one search of each batch size over the memory-mapped flat file on one thread, by each path; best
    of two, interleaved (one run where longer than 2 s)."""
    import faiss

    faiss.omp_set_num_threads(1)
    index = faiss_index.read(faiss, str(path), "flat", True)
    default = faiss.cvar.distance_compute_blas_threshold
    queries = np.ascontiguousarray(index.reconstruct_n(0, max(batches)) + 0.01, dtype=np.float32)
    scan = FlatScan(flat_vectors(faiss, index), "ip")

    def timed(way: str, n: int) -> float:
        faiss.cvar.distance_compute_blas_threshold = 1 if way == "matrix product" else 2**31 - 1
        started = time.perf_counter()
        if way == "one pass":
            scan.search(queries[:n], TOP_K)
        else:
            index.search(queries[:n], TOP_K)
        return time.perf_counter() - started

    timed("pass per row", 1)  # pages the file in
    one = timed("pass per row", 1)
    out = []
    for n in batches:
        repeats = 2 if one * n < 2 else 1
        ms: dict[str, float] = {}
        for way in SCAN_PATHS:
            if way != "pass per row" or one * n <= cap_s:
                ms[way] = min(timed(way, n) for _ in range(repeats)) * 1000
        out.append(Scan(n, ms))
    faiss.cvar.distance_compute_blas_threshold = default
    scan.close()
    return out


def print_scan(scans: Sequence[Scan], rows: int, dim: int) -> tuple[float, float]:
    """The table, and the rates of the linear model: bytes scanned per second by one thread (one row, one
    pass) and multiply-adds per second of the matrix product (the largest batch)."""
    print(f"   {'rows':>5} " + " ".join(f"{w + ' ms':>17}" for w in SCAN_PATHS) + f" {'one pass / 1 row':>17}")
    one_row = scans[0].ms["pass per row"]
    for s in scans:
        cells = " ".join(f"{s.ms[w]:17.1f}" if w in s.ms else f"{'(skipped)':>17}" for w in SCAN_PATHS)
        print(f"   {s.rows:5d} {cells} {s.ms['one pass'] / one_row:16.2f}x")
    bandwidth = rows * dim * 4 / (one_row / 1000)
    big = scans[-1]
    flops = 2 * rows * dim * big.rows / (big.ms["matrix product"] / 1000)
    print(
        f"   one thread: one row's pass reads {bandwidth / GB:.1f} GB/s; a matrix product of {big.rows} rows runs at "
        f"{flops / GB:.1f} GFLOP/s"
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
    rows: int
    kind: str
    shards: int
    encoder: str  # "real", "precomputed", or BEFORE (the real encoder, shards as before the one-pass scan)
    call_ms: dict[int, float] = dataclasses.field(default_factory=dict)  # median ms at 1 client by call size
    agree: float = float("nan")  # share of first hits equal to the unsharded index's
    recall: float = float("nan")  # share of planted rows among the RECALL_K hits
    points: dict[int, Point] = dataclasses.field(default_factory=dict)


BEFORE = "real, shards before the scan"


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


def checked_calls(data: Synthetic, calls: int) -> list[np.ndarray]:
    """``calls`` calls of ``QUERIES_PER_CALL`` questions (their rows in ``data.questions``), drawn at random, the
    same in every run."""
    order = np.random.default_rng(SEED).permutation(len(data.questions))[: calls * QUERIES_PER_CALL]
    return [order[i : i + QUERIES_PER_CALL] for i in range(0, len(order), QUERIES_PER_CALL)]


def answer_shares(data: Synthetic, expected: Sequence[str], calls: Sequence[np.ndarray],
                  answers: Sequence[Sequence[Sequence[str]]]) -> tuple[float, float]:
    """Of the queries of ``calls``, given each call's hits (passage ids per query, best first): the share whose
    first hit is ``expected``'s, and the share whose planted row is among the hits."""
    first = found = queries = 0
    for rows, hits in zip(calls, answers, strict=True):
        for r, ids in zip(rows, hits, strict=True):
            first += bool(ids) and ids[0] == expected[int(r)]
            found += passage_id(int(data.planted[r])) in ids
            queries += 1
    if not queries:
        return float("nan"), float("nan")
    return first / queries, found / queries


def agreement(target: str, data: Synthetic, expected: Sequence[str], calls: int,
              concurrency: int) -> tuple[float, float]:
    """``answer_shares`` of the router at ``target`` over ``calls`` calls, ``RECALL_K`` hits a query."""
    groups = checked_calls(data, calls)

    async def run() -> list[list[list[str]]]:
        client = AsyncRetrieverClient(target, timeout=300)
        gate = asyncio.Semaphore(concurrency)

        async def one(rows: np.ndarray) -> list[list[str]]:
            async with gate:
                reply = await client.search([data.questions[r] for r in rows], RECALL_K)
            return [[p.id for p in result.passages] for result in reply.results]

        try:
            return await asyncio.gather(*(one(g) for g in groups))
        finally:
            await client.close()

    return answer_shares(data, expected, groups, asyncio.run(run()))


def baseline_agreement(url: str, data: Synthetic, expected: Sequence[str], calls: int) -> tuple[float, float]:
    """``answer_shares`` of the Search-R1-style server at ``url`` (``throughput.baseline``), one call at a time."""
    groups = checked_calls(data, calls)
    answers = [baseline_search(url, [data.questions[r] for r in rows], RECALL_K) for rows in groups]
    return answer_shares(data, expected, groups, answers)


def sized_calls(search: Callable[[list[str]], object], pool: Sequence[str]) -> list[Callable[[], object]]:
    """A call of each of ``CALL_SIZES`` questions through ``search``, each taking the next questions of ``pool``."""
    feed = itertools.cycle(pool)

    def of(n: int) -> Callable[[], object]:
        return lambda: search([next(feed) for _ in range(n)])

    return [of(n) for n in CALL_SIZES]


def size_medians(calls: Sequence[Callable[[], object]], rounds: int) -> dict[int, float]:
    """Median ms of each of ``sized_calls``' calls at 1 client, interleaved, by call size."""
    return dict(zip(CALL_SIZES, interleaved(calls, rounds), strict=True))


def call_sizes(cluster: Cluster, pool: Sequence[str], rounds: int) -> tuple[dict[int, float], dict[int, dict]]:
    """Median ms of calls of each of ``CALL_SIZES`` questions at 1 client, interleaved; then, calling each size on
    its own for ``rounds`` calls, the router's mean ms per call in each stage (embed, fanout, merge)."""
    with RetrieverClient(cluster.target, timeout=300) as client:
        calls = sized_calls(lambda queries: client.search(queries, TOP_K), pool)
        medians = size_medians(calls, rounds)
        stages = {}
        for n, call in zip(CALL_SIZES, calls, strict=True):
            before = stage_scrape(cluster.metrics)
            for _ in range(rounds):
                call()
            after = stage_scrape(cluster.metrics)
            stages[n] = stage_means(before[0], after[0], before[1], after[1])
    return medians, stages


def measure(cluster: Cluster, served: Served, data: Synthetic, expected: Sequence[str], args: argparse.Namespace,
            levels: Sequence[int]) -> Served:
    label = f"{served.rows / 1e6:g}M {served.kind}, {served.shards} shard(s), {served.encoder}"
    if served.encoder != BEFORE:
        served.agree, served.recall = agreement(cluster.target, data, expected, args.checked_calls, 16)
    served.call_ms, stages = call_sizes(cluster, data.questions, args.rounds)
    one = served.call_ms[1]
    ratios = ", ".join(f"{n}q {ms:7.1f} ms (x{ms / one:4.2f})" for n, ms in served.call_ms.items())
    print(f"   {label:<52} first hit as unsharded {served.agree:5.3f}, recall@{RECALL_K} {served.recall:5.3f}; "
          f"1 client: {ratios}", flush=True)
    split = "; ".join(f"{n}q " + " ".join(f"{stage} {stages[n].get(stage, float('nan')):.1f}"
                                         for stage in ("embed", "fanout", "merge")) for n in CALL_SIZES)
    print(f"   {'':<52} 1 client, router ms per call: {split}", flush=True)
    for c in levels:
        served.points[c] = point = measure_load(cluster, data.questions, c, args.seconds)
        print("   " + point_row(f"{label} c={c}", point), flush=True)
    return served


def point_row(name: str, p: Point) -> str:
    r = p.load
    errors = f"{r.errors}" + (f" ({r.error_kinds})" if r.errors else "")
    split = " ".join(f"{p.stages.get(s, float('nan')):7.1f}" for s in ("embed", "fanout", "merge"))
    return (
        f"{name:<58} {r.calls_per_s:7.2f} {r.p50_ms:9.1f} {r.p99_ms:9.1f} {r.calls:6d} {errors:>6}  {split}  "
        f"{p.router_cpu_ms:7.1f} {p.shards_cpu_ms:8.1f}"
    )


@contextmanager
def layout(source: Path, store: PassageStore, shards: int, work: Path) -> Iterator[Path]:
    """``source`` imported as ``shards`` shards (the importer's code), deleted afterwards."""
    out = work / f"layout-{source.stem}-{shards}"
    shutil.rmtree(out, ignore_errors=True)
    settings = preset(DEFAULT_ENCODER, DEFAULT_BACKEND)
    import_index([source], out, settings, num_shards=shards, store=store, progress=False)
    # The shards just written are flushed before anything is timed: writeback competing for the memory and the
    # disk would slow whichever measurement comes first.
    os.sync()
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
        f"   {'':<58} {'calls/s':>7} {'p50 ms':>9} {'p99 ms':>9} {'calls':>6} {'errors':>6}  "
        f"{'embed':>7} {'fanout':>7} {'merge':>7}  {'router':>7} {'shards':>8}  (ms per call; CPU ms per call)"
    )
    results = []
    for kind, source in sources.items():
        expected = expected_first(data, kind, source)
        for n in args.shard_counts:
            with layout(source, store, n, work) as index_dir:
                print(f"   ({data.rows:,} rows, {kind}, {n} shard(s): memory available {available_gb():.1f} GB, "
                      f"load average {os.getloadavg()[0]:.1f})", flush=True)
                runs = [(e, shard_flags, () if e != "precomputed" else lookup, args.levels) for e in args.encoders]
                if kind == "flat":
                    runs.append((BEFORE, [*shard_flags, *BEFORE_SCAN], (), args.levels[:1]))
                for encoder, flags, command, levels in runs:
                    with shard_processes(index_dir, work, flags) as shards, router_process(
                        index_dir, work, shards, *deadline, command=command
                    ) as cluster:
                        served = Served(data.rows, kind, n, encoder)
                        results.append(measure(cluster, served, data, expected, args, levels))
    return results


def ratios(results: Sequence[Served], levels: Sequence[int]) -> None:
    print(f"\nratios (1 client: each call size against the 1-question call; against {BEFORE!r}: the same layout's "
          "1-question call and calls/s)")
    for r in results:
        before = next((b for b in results if (b.rows, b.kind, b.shards, b.encoder) == (r.rows, r.kind, r.shards,
                                                                                       BEFORE)), None)
        one = r.call_ms[1]
        cells = [" ".join(f"{n}q/1q {ms / one:4.2f}" for n, ms in r.call_ms.items() if n > 1)]
        if before is not None and r is not before:
            cells.append(f"1q x{one / before.call_ms[1]:4.2f}")
            for c in levels:
                if c in r.points and c in before.points:
                    now, then = r.points[c].load, before.points[c].load
                    cells.append(f"c={c}: calls/s x{now.calls_per_s / then.calls_per_s:4.2f}, "
                                 f"p99 x{now.p99_ms / then.p99_ms:4.2f}")
        print(f"  {r.rows / 1e6:g}M {r.kind}, {r.shards} shard(s), {r.encoder:<30} " + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000,3000000", help="vectors in the index, comma-separated sizes")
    parser.add_argument("--types", default="flat,ivfpq", help="index types, comma-separated")
    parser.add_argument("--shards", default="2", help="shard counts, comma-separated")
    parser.add_argument("--encoders", default="real", help="real, precomputed, or both (comma-separated)")
    parser.add_argument("--concurrency", default="32,256", help="concurrent callers")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each load measurement")
    parser.add_argument("--rounds", type=int, default=12, help="1-client rounds (a call of each size each)")
    parser.add_argument("--checked-calls", type=int, default=64, help="calls of 3 questions whose answers are checked")
    parser.add_argument("--ivf-lists", type=int, default=1024, help="ivfpq: inverted lists")
    parser.add_argument("--ivf-probes", type=int, default=16, help="ivfpq: lists searched")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="the router's deadline (--timeout-s)")
    parser.add_argument("--scan-batches", default="1,2,3,4,8,12,16,32", help="in-process scan: query rows per search")
    parser.add_argument("--scan-cap-s", type=float, default=15.0, help="in-process scan: skip longer passes per row")
    parser.add_argument("--work", type=Path, default=None, help="keep the sources here and reuse them next time")
    if sys.argv[1:2] == ["--lookup-router"]:
        # The router's own flags follow, some named like this script's (--shards): not parsed here.
        sys.exit(lookup_router(Path(sys.argv[2]), sys.argv[3:]))
    args = parser.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    args.shard_counts = [int(s) for s in args.shards.split(",")]
    args.encoders = args.encoders.split(",")
    unknown = set(args.encoders) - {"real", "precomputed"}
    if unknown:
        parser.error(f"--encoders: unknown {sorted(unknown)}; real, precomputed")
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
    sizes = [int(r) for r in args.rows.split(",")]
    print(f"{', '.join(f'{r:,}' for r in sizes)} rows; index types {', '.join(types)}; shards {args.shard_counts}; "
          f"{QUERIES_PER_CALL} questions per loaded call, top-{TOP_K}; {os.cpu_count()} CPUs; "
          f"memory available {available_gb():.1f} GB; load average {os.getloadavg()[0]:.1f}")
    started = time.perf_counter()
    results: list[Served] = []
    for rows in sizes:
        size_work = work / f"rows-{rows}"
        size_work.mkdir(parents=True, exist_ok=True)
        data, store = synthetic(rows, size_work)
        print(f"   {len(data.questions)} questions embedded and planted; {data.dim}-d; {len(store):,} passages")
        specs = [IndexSpec(t, nlist=args.ivf_lists, nprobe=args.ivf_probes) if t != "flat" else IndexSpec(t)
                 for t in types]
        sources = build_sources(data, specs, size_work)
        print(f"   sources ready after {time.perf_counter() - started:.0f} s\n")
        if "flat" in sources and rows == max(sizes):
            size = rows * data.dim * 4
            print(f"1. the scan in-process: one search over the whole flat file ({size / GB:.2f} GB), one thread")
            scans = scan_costs(sources["flat"], [int(b) for b in args.scan_batches.split(",")], args.scan_cap_s)
            drop_cache(sources["flat"])
            bandwidth, flops = print_scan(scans, rows, data.dim)
            extrapolate(bandwidth, flops)
            print()
        print(f"2. served, {rows:,} rows (router + shard processes over gRPC, one search thread per shard)")
        results += serve_all(args, data, store, sources, size_work)
        for source in sources.values():
            drop_cache(source)
    ratios(results, args.levels)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
