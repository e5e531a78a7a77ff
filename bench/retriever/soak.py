"""Soak: the retriever and the queue under sustained load, with every process's memory sampled.

    PYTHONPATH=. python bench/retriever/soak.py [--seconds 60] [--clients 64] [--rate 40] [--passages 2000]

1. retriever: the router and two shard processes (``ragr1 serve``, over gRPC, the fast encoder, an exact
   index of the first ``--passages`` shipped passages) under ``--clients`` concurrent clients calling
   Search with 3 real questions back to back for ``--seconds``; the baseline, in the same run, is one
   client for 10 s. Errors, calls/s, p50/p99 and the p99 ratio to the baseline's; the resident memory
   of each process sampled every second: after the first 10 s and at the end.
2. queue: a producer writing rollouts the size of the demo's (about 8 KB) at ``--rate`` per second into
   a real Redis, and a consumer reading, acknowledging and marking them done as the trainer does, for
   ``--seconds``; once with the trainer's trimming after each "update" (every 2 s) and once without (the
   baseline, as before trimming existed). Redis's memory and both processes' resident memory, sampled
   every second; the ratio of Redis's growth without trimming to its growth with it.

Timing and memory targets live here, not in the tests. All traffic stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from bench.retriever.throughput import QueryFeed, load_retriever, retriever
from ragr1.services.common.redis_client import connect
from ragr1.services.common.redis_server import RedisServer
from ragr1.services.common.streams import ROLLOUTS, StreamQueue
from ragr1.services.retriever.build import build_index
from ragr1.services.retriever.corpus import read_corpus, write_store
from ragr1.services.retriever.encoder import DEFAULT_BACKEND, DEFAULT_ENCODER, preset
from ragr1.shipped import all_questions, corpus_path
from ragr1.v1 import common_pb2

MB = 2**20


@contextmanager
def sampled(pids: dict[str, int], also: Callable[[], float] | None = None) -> Iterator[dict[str, list[float]]]:
    """Resident memory (MB) of each pid every second while the block runs; ``also``: one more series."""
    series: dict[str, list[float]] = {name: [] for name in pids}
    if also:
        series["redis used_memory"] = []
    processes = {name: psutil.Process(pid) for name, pid in pids.items()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            for name, proc in processes.items():
                series[name].append(proc.memory_info().rss / MB)
            if also is not None:
                series["redis used_memory"].append(also())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield series
    finally:
        stop.set()
        thread.join()


def memory_rows(series: dict[str, list[float]], settle: int = 10) -> list[str]:
    rows = []
    for name, values in series.items():
        if len(values) <= settle:
            continue
        start, end = values[settle - 1], values[-1]
        rows.append(f"   {name:<22} {start:8.1f} MB at {settle} s, {end:8.1f} MB at the end: "
                    f"{end - start:+7.1f} MB ({(end - start) / start * 100:+5.1f} %), peak {max(values):.1f} MB")
    return rows


def soak_retriever(args: argparse.Namespace, work: Path) -> None:
    store = write_store(read_corpus([corpus_path()], limit=args.passages), work / "store", progress=False)
    index = build_index(store, preset(DEFAULT_ENCODER, DEFAULT_BACKEND), work / "index", num_shards=2,
                        progress=False).parent
    pool = all_questions()
    print(f"1. retriever: router + 2 shards, {len(store)} passages, 3 questions a call, top-3")
    with retriever(index, work, "--timeout-s", "60") as cluster:
        # A shard's process is found by its metrics port (the cluster knows its metrics URL).
        shards = [url.split("//", 1)[1].split("/", 1)[0] for url in cluster.shard_metrics]
        pids = {"router": _pid_on(cluster.target)} | {f"shard {i}": _pid_on(a) for i, a in enumerate(shards)}
        base = asyncio.run(load_retriever(cluster.target, QueryFeed(pool), 1, 10.0))
        with sampled(pids) as memory:
            load = asyncio.run(load_retriever(cluster.target, QueryFeed(pool), args.clients, args.seconds))
    for name, r in (("1 client, 10 s (baseline)", base), (f"{args.clients} clients, {args.seconds:.0f} s", load)):
        print(f"   {name:<26} {r.calls:6d} calls, {r.errors} errors {r.error_kinds}, {r.calls_per_s:6.1f} calls/s, "
              f"p50 {r.p50_ms:7.1f} ms, p99 {r.p99_ms:7.1f} ms")
    print(f"   p99 at {args.clients} clients / p99 at 1 client: {load.p99_ms / base.p99_ms:.1f}x; "
          f"calls/s ratio {load.calls_per_s / base.calls_per_s:.2f}x")
    print("\n".join(memory_rows(memory)))


def _pid_on(address: str) -> int:
    port = int(address.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    raise RuntimeError(f"no process listens on {address}")


def rollout(i: int) -> common_pb2.Rollout:
    """The demo's size: a 300-token prompt, a 900-token response (a third of it retrieved passages)."""
    response = [(i * 7 + j) % 49000 + 100 for j in range(900)]
    mask = [0 if 300 <= j < 600 else 1 for j in range(900)]
    return common_pb2.Rollout(
        id=f"r{i}", task_id=f"t{i // 4}", group_id=f"t{i // 4}", prompt_token_ids=response[:300],
        response_token_ids=response, loss_mask=mask, behaviour_logprobs=[-1.2345678 * m for m in mask],
        reward=common_pb2.RewardParts(total=0.5), question="q" * 80, golden_answers=["a" * 12],
    )


def soak_queue(args: argparse.Namespace, work: Path, trim: bool) -> float:
    """One run of producer and consumer; returns Redis's memory growth in MB after the first 10 s."""
    with RedisServer(data_dir=work / f"redis-{trim}") as server:
        assert server.process is not None
        produced = StreamQueue(connect(server.url), ROLLOUTS, common_pb2.Rollout, group="trainer")
        consumer = StreamQueue(connect(server.url), ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t0")
        consumer.ensure_group()
        info = connect(server.url)
        stop = threading.Event()
        counts = {"produced": 0, "consumed": 0, "trimmed": 0}

        def produce() -> None:
            i, start = 0, time.perf_counter()
            while not stop.is_set():
                produced.produce([rollout(i)])
                i += 1
                counts["produced"] = i
                time.sleep(max(0.0, start + i / args.rate - time.perf_counter()))

        def consume() -> None:
            trimmed_at = time.monotonic()
            while not stop.is_set():
                got = consumer.consume(64, block_ms=200)
                consumer.ack(got)
                counts["consumed"] += len(got)
                if trim and time.monotonic() - trimmed_at > 2.0:  # as the trainer does after each update
                    counts["trimmed"] += consumer.trim()
                    trimmed_at = time.monotonic()

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        pids = {"redis-server": server.process.pid, "producer + consumer": psutil.Process().pid}
        with sampled(pids, lambda: int(info.info("memory")["used_memory"]) / MB) as memory:
            for t in threads:
                t.start()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join()
        size = len(rollout(0).SerializeToString())
        print(f"   trimming {'on ' if trim else 'off'}: {counts['produced']} rollouts of {size / 1024:.1f} KB "
              f"({counts['produced'] / args.seconds:.1f}/s), {counts['consumed']} consumed and acknowledged, "
              f"{counts['trimmed']} trimmed; stream length at the end {consumer.depth()}")
        print("\n".join(memory_rows(memory)))
        used = memory["redis used_memory"]
        return used[-1] - used[9]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each soak")
    parser.add_argument("--clients", type=int, default=64, help="concurrent retriever clients")
    parser.add_argument("--rate", type=float, default=40.0, help="rollouts per second into the queue")
    parser.add_argument("--passages", type=int, default=2000, help="first N passages of the shipped corpus")
    parser.add_argument("--only", choices=("retriever", "queue"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        if args.only != "queue":
            soak_retriever(args, work)
            print()
        if args.only != "retriever":
            print(f"2. queue: {args.rate:.0f} rollouts/s for {args.seconds:.0f} s into a real Redis, "
                  "consumed as the trainer does")
            growth = {trim: soak_queue(args, work, trim) for trim in (False, True)}
            minutes = (args.seconds - 10) / 60
            print(f"   Redis memory growth after the first 10 s: {growth[False] / minutes:+.1f} MB/min without "
                  f"trimming, {growth[True] / minutes:+.2f} MB/min with it")


if __name__ == "__main__":
    main()
