"""Retriever throughput and the costs behind it, against a Search-R1-style server, all in one run.

    python bench/retriever/throughput.py [--passages 2000] [--seconds 6] [--concurrency 32,256,1024]

Everything runs in this one invocation on the shipped corpus (its first ``--passages`` passages), with
an exact flat index, and prints ratios against baselines measured in the same run:

1. encoders: all-MiniLM-L6-v2 on each backend (torch float32, ONNX float32, ONNX int8): recall@5 of
   supporting titles on the HotpotQA questions whose paragraphs are in the slice, top-5 overlap with
   float32 torch, and single-thread encode latency of 1 and 3 questions;
2. compressed index types: top-10 overlap of IVF-PQ and HNSW with exact search;
3. time to ready: a shard process with its index memory-mapped against read whole, and opening a
   flat index of ``--ready-rows`` vectors (the slice's real embeddings repeated) both ways, then its
   first search (which pages a memory-mapped flat index in);
4. load: a Search-R1-style server (a thread per request, each embedding its own queries with float32
   torch and searching on its own) against the router + shard processes over gRPC with the fast
   encoder, at each concurrency level (asyncio clients, calls of 3 questions back to back for
   ``--seconds``): calls/s, queries/s, p50/p99, errors, and the router's time per call split into
   embedding, fan-out and merging (from its Prometheus metrics); at the first level, ``--rounds`` rounds
   of baseline, retriever and the in-process ceiling of the same encoder and index in turn, with the
   ratios per round and their median; 3-question against 1-question call latency at 1 client; the
   query cache.

Embeddings come from the cache that ``ragr1 index build`` keeps, so only the first run embeds.
All traffic stays on loopback; every measurement is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever import plan
from ragr1.services.retriever.build import build_index, embed_store, embeddings_cache_dir
from ragr1.services.retriever.client import AsyncRetrieverClient, RetrieverClient
from ragr1.services.retriever.corpus import PassageStore, read_corpus, write_store
from ragr1.services.retriever.encoder import BACKENDS, DEFAULT_BACKEND, DEFAULT_ENCODER, Encoder, preset
from ragr1.services.retriever.index import IndexSpec
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.shipped import all_questions, corpus_path, read_jsonl, train_path

QUERIES_PER_CALL = 3
TOP_K = 3


def one_thread_each() -> None:
    """torch and FAISS on one thread: with their default (all cores) a busy 2-core host stalls them."""
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)


# ---- 1. encoders ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class EncoderFigures:
    backend: str
    recall_at_5: float
    overlap_at_5: float
    one_ms: float
    three_ms: float
    passages_per_s: float


def supporting_recall(titles: list[set[str]], questions: list[dict]) -> float:
    pairs = zip(questions, titles, strict=True)
    per_question = [np.mean([t in got for t in q["supporting_titles"]]) for q, got in pairs]
    return float(np.mean(per_question))


def compare_encoders(store: PassageStore, pool: Sequence[str]) -> list[EncoderFigures]:
    import faiss

    ids = {p.id for p in store}
    hotpot = [q for q in read_jsonl(train_path("hotpotqa")) if all(p["pid"] in ids for p in q["paragraphs"])]
    texts = [q["question"] for q in hotpot]
    top: dict[str, np.ndarray] = {}
    out = []
    for backend in BACKENDS:
        settings = preset(DEFAULT_ENCODER, backend)
        vectors = embed_store(store, settings, embeddings_cache_dir(store, settings), progress=False).rows(
            0, len(store)
        )
        encoder = Encoder(settings, device="cpu", threads=1)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        _, rows = index.search(encoder.encode_queries(texts), 5)
        top[backend] = rows
        titles = [{store[int(r)].title for r in row} for row in rows]
        overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(rows, top["torch"], strict=True)])
        one, three = interleaved([_encode_call(encoder, pool[:1]), _encode_call(encoder, pool[1:4])], 40)
        # Index builds: passages as the demo embeds them (128 tokens), all cores.
        builder = Encoder(dataclasses.replace(settings, max_passage_tokens=128), device="cpu")
        passages = [p.contents for p in store.iter_range(0, 64)]
        (build_ms,) = interleaved([lambda: builder.encode_passages(passages)], 2)  # noqa: B023 - used at once
        recall = supporting_recall(titles, hotpot)
        out.append(EncoderFigures(backend, recall, float(overlap), one, three, len(passages) / build_ms * 1000))
    return out


def _encode_call(encoder: Encoder, queries: Sequence[str]) -> Callable[[], object]:
    return lambda: encoder.encode_queries(queries)


def interleaved(calls: Sequence[Callable[[], object]], rounds: int) -> list[float]:
    """Median ms of each call, run in turn (A B A B ...) so that the machine's drift hits all alike."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            started = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - started)
    return [float(np.median(t)) * 1000 for t in times]


# ---- 3. time to ready -------------------------------------------------------------------------------------


def open_times(vectors: np.ndarray, rows: int, work: Path) -> dict[bool, tuple[float, float]]:
    """Seconds to open a flat index of ``rows`` vectors (what a shard does before it is ready), and
    then to run its first search, memory-mapped (True) and read whole (False); best of two each. The
    file was just written, so its pages are in the page cache: a cold disk makes read-whole slower."""
    import faiss

    from ragr1.services.retriever import index as faiss_index

    index = faiss.IndexFlatIP(vectors.shape[1])
    for start in range(0, rows, len(vectors)):
        index.add(vectors[: min(len(vectors), rows - start)])
    path = work / "big.flat.faiss"
    faiss.write_index(index, str(path))
    del index
    timings: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for mmap in (True, False, True, False):
        started = time.perf_counter()
        opened = faiss_index.read(faiss, str(path), "flat", mmap)
        ready = time.perf_counter()
        opened.search(vectors[:1], 1)
        timings[mmap].append((ready - started, time.perf_counter() - ready))
        del opened
    path.unlink()
    return {m: min(t) for m, t in timings.items()}


def metric(url: str, name: str, labels: str = "") -> dict[str, float]:
    """Samples of one metric family from a Prometheus text page: {labels: value}."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    return {m.group(1) or "": float(m.group(2)) for m in pattern.finditer(text) if labels in (m.group(1) or "")}


# ---- 4. the servers -------------------------------------------------------------------------------------


def baseline_server(index_dir: Path, port: int, library_threads: bool = False) -> None:
    """Serves POST /retrieve as Search-R1's retrieval_server.py does: shard 0 of ``index_dir`` (the whole index
    in a 1-shard layout) read whole into memory by ``faiss.read_index``, the index's model on float32 torch
    whatever backend the index declares, and a thread per request that embeds its own queries and searches on
    its own."""
    import faiss

    if not library_threads:
        one_thread_each()
    manifest = LoadedManifest(index_dir)
    encoder = Encoder(dataclasses.replace(manifest.manifest.encoder, backend="torch"), device="cpu")
    index = faiss.read_index(str(manifest.shard_path(0)))
    store = PassageStore(manifest.store_path())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            scores, rows = index.search(encoder.encode_queries(body["queries"]), body.get("topk", 3))
            result = [
                [
                    {
                        "document": {"id": store[int(r)].id, "contents": store[int(r)].contents},
                        "score": float(s),
                    }
                    for s, r in zip(ss, rr, strict=True)
                ]
                for ss, rr in zip(scores, rows, strict=True)
            ]
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 2048  # as uvicorn's backlog, so that clients connecting at once are not reset

    server = Server(("127.0.0.1", port), Handler)
    print(f"READY baseline http=127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


@contextmanager
def baseline(index_dir: Path, logs: Path, library_threads: bool = False) -> Iterator[str]:
    """The baseline server as a process; ``library_threads``: torch's and FAISS's default threads (every core), as
    Search-R1's server runs, instead of one each."""
    # A log of its own: the READY line is read from it, and a restarted server's log would hold the last one's.
    log = logs / f"baseline-{time.monotonic_ns()}.log"
    command = [sys.executable, __file__, "--baseline-server", str(index_dir),
               *(["--baseline-library-threads"] if library_threads else [])]
    proc = ServiceProcess("baseline", command, None, log).launch()
    try:
        yield f"http://{proc.wait_ready(180, 'baseline')['http']}/retrieve"
    finally:
        proc.stop()


def shard_time_to_ready(index_dir: Path, logs: Path, mmap: bool) -> float:
    """A shard process's own time to ready (its metric: process start to serving), checksum off."""
    flags = ["--index", str(index_dir), "--port", "0", "--metrics-port", "0", "--checksum", "off"]
    flags.append("--mmap" if mmap else "--no-mmap")
    log = logs / f"ready-{time.monotonic_ns()}.log"  # a log of its own, as in retriever()
    with ServiceProcess.ragr1("shard", ["serve", "retriever-shard", *flags], None, log) as p:
        port = p.wait_ready(10, "retriever-shard-0")["metrics"]
        return metric(f"http://127.0.0.1:{port}/metrics", "ragr1_retriever_shard_time_to_ready_seconds")[""]


@dataclasses.dataclass
class Cluster:
    target: str
    metrics: str
    shard_metrics: list[str]


@contextmanager
def shard_processes(index_dir: Path, logs: Path, shard_flags: Sequence[str] = ()) -> Iterator[list[dict[str, str]]]:
    """The index's shard processes, one FAISS search thread each unless ``shard_flags`` say otherwise;
    yields each one's READY line (its ``grpc`` address and ``metrics`` port)."""
    shards = LoadedManifest(index_dir).manifest.num_shards
    common = ["--index", str(index_dir), "--port", "0", "--metrics-port", "0"]
    logs = logs / f"shards-{time.monotonic_ns()}"  # logs of their own: READY lines are read from them
    started = [
        ServiceProcess.ragr1(
            f"shard{i}",
            ["serve", "retriever-shard", *common, "--shard", str(i), "--search-threads", "1", *shard_flags],
            None,
            logs / f"shard{i}.log",
        ).launch()
        for i in range(shards)
    ]
    try:
        yield [p.wait_ready(120, f"retriever-shard-{i}") for i, p in enumerate(started)]
    finally:
        for p in started:
            p.stop()


@contextmanager
def router_process(
    index_dir: Path, logs: Path, shards: Sequence[dict[str, str]], *router_flags: str,
    command: Sequence[str] = (),
) -> Iterator[Cluster]:
    """A router over running shards, started by ``command`` (default ``ragr1 serve retriever``) with the
    router's flags. The query cache is off unless ``router_flags`` turn it on: the question pool repeats,
    and hits would flatter the figures."""
    flags = [
        "--index", str(index_dir), "--port", "0", "--metrics-port", "0",
        "--shards", ",".join(r["grpc"] for r in shards), "--http-port", "-1", "--query-cache-size", "0",
        *router_flags,
    ]
    log = logs / f"router-{time.monotonic_ns()}.log"
    args = [*(command or [sys.executable, "-m", "ragr1", "serve", "retriever"]), *flags]
    with ServiceProcess("router", args, None, log) as router:
        ready = router.wait_ready(60, "retriever")
        yield Cluster(
            str(router.target),
            f"http://127.0.0.1:{ready['metrics']}/metrics",
            [f"http://127.0.0.1:{r['metrics']}/metrics" for r in shards],
        )


@contextmanager
def retriever(index_dir: Path, logs: Path, *router_flags: str, shard_flags: Sequence[str] = ()) -> Iterator[Cluster]:
    """Shard processes and a router over them (``router_process``)."""
    with shard_processes(index_dir, logs, shard_flags) as shards, router_process(
        index_dir, logs, shards, *router_flags
    ) as cluster:
        yield cluster


# ---- 4. load ------------------------------------------------------------------------------------------------


class QueryFeed:
    """Hands out calls of real questions; each call's questions come ``repeat`` times in a row
    (``repeat=5``: five GRPO samples of one prompt opening with the same search)."""

    def __init__(self, pool: Sequence[str], repeat: int = 1) -> None:
        self._cycle = itertools.cycle(pool)
        self._repeat = repeat
        self._last: list[str] = []
        self._given = 0

    def take(self, n: int) -> list[str]:
        if self._given % self._repeat == 0 or len(self._last) != n:
            self._last = [next(self._cycle) for _ in range(n)]
        self._given += 1
        return list(self._last)


@dataclasses.dataclass
class Load:
    calls_per_s: float
    queries_per_s: float
    p50_ms: float
    p99_ms: float
    calls: int
    errors: int
    error_kinds: str


async def drive(
    call: Callable[[list[str]], Awaitable[object]], feed: QueryFeed, concurrency: int, seconds: float
) -> Load:
    """``concurrency`` tasks calling back to back until ``seconds`` pass (in-flight calls finish)."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    await call(feed.take(QUERIES_PER_CALL))  # warm-up: connections, first batch
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                await call(feed.take(QUERIES_PER_CALL))
            except Exception as exc:  # a failed call is counted, and the client goes on
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies or [float("nan")]) * 1000
    return Load(
        len(latencies) / elapsed,
        len(latencies) * QUERIES_PER_CALL / elapsed,
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
        len(latencies),
        sum(errors.values()),
        ",".join(f"{k}:{v}" for k, v in errors.items()),
    )


def retrieve_body(queries: list[str], topk: int) -> dict[str, object]:
    """A POST /retrieve request's body, as Search-R1's rollouts send it."""
    return {"queries": queries, "topk": topk, "return_scores": True}


def baseline_search(url: str, queries: list[str], topk: int = TOP_K) -> list[list[str]]:
    """One call of the baseline server (a new connection, as Search-R1's ``requests.post``): each query's hits'
    passage ids, best first."""
    body = json.dumps(retrieve_body(queries, topk)).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        result = json.loads(reply.read())["result"]
    return [[hit["document"]["id"] for hit in hits] for hits in result]


async def load_baseline(url: str, pool: Sequence[str], concurrency: int, seconds: float) -> Load:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def call(queries: list[str]) -> object:
            async with session.post(url, json=retrieve_body(queries, TOP_K)) as reply:
                reply.raise_for_status()
                return await reply.json()

        return await drive(call, QueryFeed(pool), concurrency, seconds)


async def load_retriever(target: str, feed: QueryFeed, concurrency: int, seconds: float) -> Load:
    # A few channels: one HTTP/2 connection would serialise the client side's framing on one socket.
    clients = [AsyncRetrieverClient(target, timeout=60) for _ in range(min(4, concurrency))]
    turn = itertools.cycle(clients)
    try:

        async def call(queries: list[str]) -> object:
            return await next(turn).search(queries, TOP_K)

        return await drive(call, feed, concurrency, seconds)
    finally:
        for c in clients:
            await c.close()


def stage_means(
    before: dict[str, float], after: dict[str, float], counts_b: dict[str, float], counts_a: dict[str, float]
) -> dict[str, float]:
    """Mean ms per call of each router stage between two scrapes."""
    out = {}
    for labels, total in after.items():
        stage = labels.split('"')[1]
        calls = counts_a.get(labels, 0) - counts_b.get(labels, 0)
        out[stage] = (total - before.get(labels, 0)) / calls * 1000 if calls else float("nan")
    return out


def stage_scrape(url: str) -> tuple[dict[str, float], dict[str, float]]:
    return metric(url, "ragr1_retriever_stage_seconds_sum"), metric(url, "ragr1_retriever_stage_seconds_count")


def ceiling(index_dir: Path, pool: Sequence[str], batch: int, workers: int, repeats: int = 2) -> float:
    """Queries/s of the index's own encoder and index called in-process on batches of ``batch``
    questions from ``workers`` threads (as the router's encoder workers), best of ``repeats``."""
    import faiss

    faiss.omp_set_num_threads(1)
    manifest = LoadedManifest(index_dir)
    encoder = Encoder(manifest.manifest.encoder, device="cpu", threads=1, export_dir=manifest.encoder_dir())
    index = faiss.read_index(str(manifest.shard_path(0)))
    encoder.encode_queries(list(pool[:batch]))
    queries = list(pool[:1152])
    batches = [queries[i : i + batch] for i in range(0, len(queries), batch)]
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        with ThreadPoolExecutor(workers) as threads:
            list(threads.map(lambda b: index.search(encoder.encode_queries(b), TOP_K), batches))
        best = max(best, len(queries) / (time.perf_counter() - started))
    return best


def one_vs_three(target: str, pool: Sequence[str], rounds: int) -> tuple[float, float]:
    """Median ms of 1-question and 3-question calls at 1 client, interleaved."""
    feed = itertools.cycle(pool)
    with RetrieverClient(target, timeout=60) as client:
        return tuple(  # type: ignore[return-value]
            interleaved(
                [
                    lambda: client.search([next(feed)], TOP_K),
                    lambda: client.search([next(feed) for _ in range(3)], TOP_K),
                ],
                rounds,
            )
        )


def row_header() -> str:
    """The header of ``row``'s columns."""
    return f"   {'':<34} {'calls/s':>8} {'queries/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'calls':>6} {'errors':>6}"


def row(name: str, r: Load, stages: dict[str, float] | None = None) -> str:
    split = ""
    if stages:
        split = "  " + " ".join(f"{s} {stages.get(s, float('nan')):6.1f}" for s in ("embed", "fanout", "merge"))
    errors = f"{r.errors}" + (f" ({r.error_kinds})" if r.errors else "")
    return (
        f"{name:<34} {r.calls_per_s:8.1f} {r.queries_per_s:9.1f} {r.p50_ms:8.1f} {r.p99_ms:8.1f} "
        f"{r.calls:6d} {errors:>6}{split}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=2000, help="first N passages of the shipped corpus")
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each load measurement")
    parser.add_argument("--concurrency", default="32,256,1024", help="concurrent calls (the first is compared)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds at the first level")
    parser.add_argument("--ready-rows", type=int, default=1_000_000, help="vectors of the time-to-ready file")
    parser.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND, help="the retriever's encoder")
    parser.add_argument("--baseline-server", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--baseline-library-threads", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_server is not None:
        baseline_server(args.baseline_server, 0, args.baseline_library_threads)
        return
    with tempfile.TemporaryDirectory(prefix="retriever-bench-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, work: Path) -> None:
    levels = [int(c) for c in args.concurrency.split(",")]
    first = levels[0]
    pool = all_questions()
    store = write_store(read_corpus([corpus_path()], limit=args.passages), work / "store", progress=False)
    print(f"{len(store)} passages, {len(pool)} distinct questions, {QUERIES_PER_CALL} per call, top-{TOP_K}\n")

    print("1. encoders (all-MiniLM-L6-v2), single thread")
    figures = compare_encoders(store, pool)
    fp32 = figures[0]
    print(
        f"   {'backend':<10} {'recall@5':>8} {'overlap@5':>9} {'1 query ms':>10} {'3 queries ms':>12} "
        f"{'speed-up':>8} {'passages/s':>10}"
    )
    for f in figures:
        print(
            f"   {f.backend:<10} {f.recall_at_5:8.3f} {f.overlap_at_5:9.3f} {f.one_ms:10.2f} {f.three_ms:12.2f} "
            f"{fp32.three_ms / f.three_ms:7.2f}x {f.passages_per_s:10.1f}"
        )
    eligible = [f for f in figures if f.recall_at_5 >= fp32.recall_at_5 - 0.01]
    fastest = min(eligible, key=lambda f: f.three_ms)
    print(f"   fastest within 0.01 recall of float32: {fastest.backend} (default: {DEFAULT_BACKEND})\n")

    print("2. compressed index types against exact search (top-10 overlap, fast-encoder vectors)")
    settings = preset(DEFAULT_ENCODER, args.backend)
    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings), progress=False).rows(0, len(store))
    queries = Encoder(settings, device="cpu").encode_queries(pool[:500])
    nlist = max(1, len(store) // 39)
    specs = [IndexSpec("ivfpq", nlist=nlist, pq_m=48, pq_bits=4, nprobe=max(1, nlist // 4)), IndexSpec("hnsw")]
    for cost in plan.compressed_recall(vectors, queries, specs, 10):
        print(f"   {cost.index_type:<6} overlap {cost.overlap_at_k:.3f}, {cost.search_ms_per_query:.3f} ms/query")
    print()

    torch_index = build_index(store, preset(DEFAULT_ENCODER, "torch"), work / "torch-1", progress=False).parent
    fast = {n: build_index(store, settings, work / f"fast-{n}", num_shards=n, progress=False).parent for n in (1, 2)}

    print("3. time to ready")
    ready = {mmap: min(shard_time_to_ready(fast[1], work, mmap) for _ in range(2)) for mmap in (True, False)}
    print(f"   shard process ({len(store)} passages): mmap {ready[True]:.2f} s, read whole {ready[False]:.2f} s")
    opens = open_times(vectors, args.ready_rows, work)
    size = args.ready_rows * vectors.shape[1] * 4
    for mmap, (opened, first_search) in opens.items():
        print(
            f"   a {size / 2**30:.2f} GiB flat index ({args.ready_rows:,} vectors), "
            f"{'memory-mapped' if mmap else 'read whole':<13}: open {opened * 1000:7.1f} ms, "
            f"then first search {first_search * 1000:6.1f} ms"
        )
    print()

    print("4. load")
    print(row_header() + "  router ms/call: embed fanout merge")
    results: dict[str, Load] = {}

    def measure(cluster: Cluster, name: str, concurrency: int, feed: QueryFeed) -> Load:
        before = stage_scrape(cluster.metrics)
        r = asyncio.run(load_retriever(cluster.target, feed, concurrency, args.seconds))
        after = stage_scrape(cluster.metrics)
        print("   " + row(name, r, stage_means(before[0], after[0], before[1], after[1])), flush=True)
        return r

    # The deadline: at the highest concurrency calls queue for longer than the router's default on a small
    # shared host; the figures are of throughput and latency, and a call that misses it would be retried by
    # an RL worker anyway.
    deadline = ("--timeout-s", "60")
    # Rounds of baseline, retriever and in-process ceiling in turn, all servers up, so that the load
    # from other jobs on a shared host hits each alike; the ratios are per round, then their median.
    rounds: list[dict[str, float]] = []
    with baseline(torch_index, work) as url, retriever(fast[1], work, *deadline) as cluster:
        for i in range(args.rounds):
            base = asyncio.run(load_baseline(url, pool, first, args.seconds))
            print("   " + row(f"baseline (Search-R1 style) c={first}", base), flush=True)
            ours = measure(cluster, f"retriever 1 shard c={first}", first, QueryFeed(pool))
            peak = max(ceiling(fast[1], pool, b, w, repeats=1) for b, w in [(96, 1), (48, 2)])
            print(f"   {'in-process ceiling (' + args.backend + ')':<34} {'':>8} {peak:9.1f}", flush=True)
            rounds.append(
                {
                    "calls": ours.calls_per_s / base.calls_per_s,
                    "p99": ours.p99_ms / base.p99_ms,
                    "errors": ours.errors + base.errors,
                    "ceiling": ours.queries_per_s / peak,
                }
            )
            results[f"1/{first}/{i}"] = ours
        for c in levels[1:]:
            results[f"1/{c}"] = measure(cluster, f"retriever 1 shard c={c}", c, QueryFeed(pool))
        one, three = one_vs_three(cluster.target, pool, 60)
        print(f"   1 client: 1 question {one:.1f} ms, 3 questions {three:.1f} ms (p50)")
    with retriever(fast[2], work, *deadline) as cluster:
        two = measure(cluster, f"retriever 2 shards c={first}", first, QueryFeed(pool))
    for cache in ("0", "10000"):
        with retriever(fast[1], work, "--query-cache-size", cache) as cluster:
            name = f"repeated x5, cache {'on' if cache != '0' else 'off'}"
            results[name] = measure(cluster, f"{name} c={first}", first, QueryFeed(pool, repeat=5))

    def median(key: str) -> str:
        values = [r[key] for r in rounds]
        return f"{float(np.median(values)):5.2f}  (rounds: {', '.join(f'{v:.2f}' for v in values)})"

    print("\nratios (targets in brackets)")
    print(f"  calls/s at {first}, retriever / baseline:             {median('calls')}  [>= 2]")
    print(f"  p99 at {first}, retriever / baseline:                 {median('p99')}  [<= 0.33]")
    print(f"  errors at {first}, both servers, all rounds:          {sum(int(r['errors']) for r in rounds)}  [0]")
    print(f"  queries/s at {first}, retriever / in-process ceiling: {median('ceiling')}  [>= 0.85]")
    print(
        "  errors at "
        + " / ".join(str(c) for c in levels[1:])
        + ": "
        + " / ".join(str(results[f"1/{c}"].errors) for c in levels[1:])
    )
    print(f"  latency at 1 client, 3 questions / 1 question:       {three / one:5.2f}   [<= 1.3]")
    print(
        f"  encoder {fastest.backend} / float32 torch, 3 questions: {fp32.three_ms / fastest.three_ms:5.2f}x faster, "
        f"recall@5 {fastest.recall_at_5 - fp32.recall_at_5:+.3f}  [>= -0.01]"
    )
    print(
        f"  index build embedding, {fastest.backend} / float32 torch:    "
        f"{fastest.passages_per_s / fp32.passages_per_s:5.2f}x passages/s"
    )
    print(f"  time to ready, shard process with mmap / read whole: {ready[True] / ready[False]:5.2f}")
    print(f"  opening {size / 2**30:.2f} GiB, mmap / read whole:           {opens[True][0] / opens[False][0]:7.4f}")
    print(f"  calls/s at {first}, 2 shards / 1 shard (last round):  {two.calls_per_s / ours.calls_per_s:5.2f}x")
    on, off = results["repeated x5, cache on"], results["repeated x5, cache off"]
    print(f"  calls/s at {first}, calls repeated x5, cache on / off: {on.calls_per_s / off.calls_per_s:5.2f}x")


if __name__ == "__main__":
    main()
