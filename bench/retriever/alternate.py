"""The 1-client latency of 1-, 2- and 3-question calls through the real router and shards, the shard's one-pass scan
against the shard before it and against a Search-R1-style server over the same index, alternated, so that the
machine's drift between two runs does not pass for a difference between them; then the retriever against the
Search-R1-style server under load.

    PYTHONPATH=. python bench/retriever/alternate.py [--rows 3000000] [--shards 2] [--repeats 2] [--rounds 40]
        [--types flat,ivfpq] [--search-r1 | --no-search-r1] [--concurrency 32] [--load-seconds 8]
        [--checked-calls 8] --work DIR

``bench/retriever/scale.py`` measures each layout once, one after the other, minutes apart; a 1-question call's
latency (which the scan does not change: one row goes through FAISS's own pass either way) then moves by as much as
a sixth between runs of the same code. Here, for each flat layout, shard processes with the scan
(``--blocked-scan``), shard processes without it (``scale.BEFORE_SCAN``) and, with ``--search-r1`` (the default),
the Search-R1-style server are started in turn, ``--repeats`` times each, A B C A B C; for every other index type,
its shards ``--repeats`` times. Each start first checks the answers of ``--checked-calls`` calls of 3 questions
("first hit": the share of queries whose first hit is the unsharded index's, the planted row in a flat index),
then measures the median of ``--rounds`` calls of each size at 1 client, interleaved, and for the router its time
per call in each stage.

The Search-R1-style server is ``throughput.baseline_server``, serving an index as Search-R1's
``search_r1/search/retrieval_server.py`` does: POST /retrieve, the index's model on float32 torch, the FAISS file
read whole into memory by ``faiss.read_index``, a thread per request that embeds its own queries and searches on
its own, with torch's and FAISS's default threads (every core), as Search-R1's server runs
(``--search-r1-threads one``: one each, as each of our shards searches on one thread). It serves the same source
file imported as 1 shard (shard 0 is then the whole index), so it needs the flat source's size in memory, and as
much again on disk for that layout.

Under load, with ``--concurrency`` above 0: after its 1-client part, each start of the one-pass shards and of the
Search-R1-style server is loaded by ``--concurrency`` clients calling with 3 questions back to back for
``--load-seconds`` (``throughput``'s load drivers): calls/s, queries/s, p50/p99, errors, printed after the 1-client
lines. Last, the ratios retriever (one-pass scan) / Search-R1-style server: of the 1-client medians (the median
over starts of each size's) and of calls/s and p99 under load (per repeat, and their median).

Uses the sources ``scale.py`` built in ``--work`` (the same file names), building them when missing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from bench.retriever import scale
from bench.retriever.throughput import (
    Load,
    baseline,
    baseline_search,
    load_baseline,
    router_process,
    row,
    row_header,
    shard_processes,
)
from ragr1.services.retriever.index import IndexSpec
from ragr1.services.retriever.manifest import LoadedManifest

ONE_PASS = "one-pass scan"
BEFORE = "before the scan"
SEARCH_R1 = "Search-R1-style server"
# A background checksum would read the whole file while measuring.
SHARD_FLAGS = ("--checksum", "off")
# The router's deadline, as scale.py's: at millions of rows a call can wait behind whole passes over the vectors.
ROUTER_FLAGS = ("--timeout-s", "300")
# Calls whose answers are checked run this many at a time: they only need to be right, not timed.
CHECK_CONCURRENCY = 4


@dataclasses.dataclass
class Start:
    """What one start of a variant measured."""

    first: float  # share of the checked queries whose first hit is the unsharded index's
    medians: dict[int, float]  # median ms at 1 client by call size
    split: str  # the router's ms per call by stage, printed ("" for the Search-R1-style server)
    load: Load | None = None  # under load, if loaded
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # the router's, under load

    def line(self, kind: str, name: str) -> str:
        """Its 1-client line: the first-hit share and the median ms per call size, with their ratio to the
        1-question call."""
        one = self.medians[1]
        sizes = ", ".join(f"{n}q {ms:6.1f} (x{ms / one:4.2f})" for n, ms in self.medians.items())
        return f"   {kind:<6} {name:<22} first hit {self.first:5.3f}   {sizes}" + (
            f"   {self.split}" if self.split else "")


@contextmanager
def search_r1_server(index_dir: Path, logs: Path, library_threads: bool) -> Iterator[str]:
    """``throughput.baseline`` over a 1-shard layout, yielding its URL. Once the server holds the file in its own
    memory, the file's cached pages are dropped, so that the page cache keeps the shards' layout rather than a
    second copy of what the server already holds."""
    with baseline(index_dir, logs, library_threads) as url:
        scale.drop_cache(LoadedManifest(index_dir).shard_path(0))
        yield url


def router_start(index_dir: Path, work: Path, data: scale.Synthetic, expected: Sequence[str],
                 args: argparse.Namespace, shard_flags: Sequence[str], load: bool) -> Start:
    """One start of the shards and the router, loaded after its 1-client part if ``load``."""
    with shard_processes(index_dir, work, shard_flags) as shards, router_process(
        index_dir, work, shards, *ROUTER_FLAGS
    ) as cluster:
        first, _ = scale.agreement(cluster.target, data, expected, args.checked_calls, CHECK_CONCURRENCY)
        medians, stages = scale.call_sizes(cluster, data.questions, args.rounds)
        point = scale.measure_load(cluster, data.questions, args.concurrency, args.load_seconds) if load else None
    split = "; ".join(f"{n}q embed {s.get('embed', float('nan')):5.1f} fanout {s.get('fanout', float('nan')):6.1f}"
                      for n, s in stages.items())
    return Start(first, medians, split, point.load if point else None, point.stages if point else {})


def search_r1_start(whole: Path, work: Path, data: scale.Synthetic, expected: Sequence[str],
                    args: argparse.Namespace, load: bool) -> Start:
    """One start of the Search-R1-style server, loaded after its 1-client part if ``load``."""
    with search_r1_server(whole, work, args.search_r1_threads == "library") as url:
        first, _ = scale.baseline_agreement(url, data, expected, args.checked_calls)
        calls = scale.sized_calls(lambda queries: baseline_search(url, queries), data.questions)
        medians = scale.size_medians(calls, args.rounds)
        loaded = asyncio.run(load_baseline(url, data.questions, args.concurrency, args.load_seconds)) if load else None
    return Start(first, medians, "", loaded)


def print_loads(kind: str, starts: dict[str, list[Start]], concurrency: int, seconds: float) -> None:
    print(f"\n   {concurrency} clients, calls of 3 questions back to back for {seconds:g} s (each start loaded after "
          "its 1-client part)")
    print(row_header() + "  router ms/call: embed fanout merge")
    for ours, base in zip(starts[ONE_PASS], starts[SEARCH_R1], strict=True):
        assert ours.load is not None and base.load is not None
        print("   " + row(f"{kind} {SEARCH_R1} c={concurrency}", base.load))
        print("   " + row(f"{kind} {ONE_PASS} c={concurrency}", ours.load, ours.stages))


def print_ratios(kind: str, starts: dict[str, list[Start]], concurrency: int) -> None:
    """The retriever (one-pass scan) against the Search-R1-style server."""

    def median(values: Sequence[float]) -> str:
        return f"x{float(np.median(values)):4.2f}" + (
            f" (repeats: {', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else "")

    def over_starts(name: str, n: int) -> float:
        return float(np.median([s.medians[n] for s in starts[name]]))

    print(f"\n   ratios, the retriever ({ONE_PASS}) / the {SEARCH_R1}:")
    sizes = ", ".join(f"{n}q x{over_starts(ONE_PASS, n) / over_starts(SEARCH_R1, n):4.2f}" for n in scale.CALL_SIZES)
    print(f"   {kind:<6} 1 client, median ms: {sizes}")
    loads = [(ours.load, base.load) for ours, base in zip(starts[ONE_PASS], starts[SEARCH_R1], strict=True)
             if ours.load is not None and base.load is not None]
    if loads:
        calls = median([ours.calls_per_s / base.calls_per_s for ours, base in loads])
        p99 = median([ours.p99_ms / base.p99_ms for ours, base in loads])
        errors = sum(ours.errors + base.errors for ours, base in loads)
        print(f"   {kind:<6} c={concurrency}: calls/s {calls}; p99 {p99}; errors, both servers, all repeats: {errors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000, help="vectors in the index")
    parser.add_argument("--shards", type=int, default=2, help="shards")
    parser.add_argument("--types", default="flat,ivfpq", help="index types, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="starts of each variant, alternated")
    parser.add_argument("--rounds", type=int, default=40, help="1-client rounds (a call of each size each)")
    parser.add_argument("--checked-calls", type=int, default=8, help="calls of 3 questions whose answers are checked")
    parser.add_argument("--search-r1", action=argparse.BooleanOptionalAction, default=True,
                        help="flat layouts: also the Search-R1-style server over the same index")
    parser.add_argument("--search-r1-threads", choices=("library", "one"), default="library",
                        help="the Search-R1-style server's torch and FAISS threads: the libraries' default (every "
                        "core), as Search-R1's server runs, or one each, as each of our shards searches")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="clients loading each start of the retriever and the Search-R1-style server (0: none)")
    parser.add_argument("--load-seconds", type=float, default=8.0, help="duration of each load measurement")
    parser.add_argument("--ivf-lists", type=int, default=1024, help="ivfpq: inverted lists")
    parser.add_argument("--ivf-probes", type=int, default=16, help="ivfpq: lists searched")
    parser.add_argument("--work", type=Path, required=True, help="scale.py's --work: the sources, built if missing")
    args = parser.parse_args()
    work = args.work / f"rows-{args.rows}"
    work.mkdir(parents=True, exist_ok=True)
    data, store = scale.synthetic(args.rows, work)
    specs = [IndexSpec(t, nlist=args.ivf_lists, nprobe=args.ivf_probes) if t != "flat" else IndexSpec(t)
             for t in args.types.split(",")]
    sources = scale.build_sources(data, specs, work)
    print(f"{args.rows:,} rows, {args.shards} shards, the real encoder; first hit: the share of {args.checked_calls} "
          f"checked calls' questions answered as by the unsharded index; median ms at 1 client of {args.rounds} calls "
          f"of each size; the router's ms per call by stage; memory available {scale.available_gb():.1f} GB")
    if args.search_r1:
        print(f"{SEARCH_R1}: the same index as 1 shard, float32 torch encoder, index read whole, a thread per request, "
              f"{'every core' if args.search_r1_threads == 'library' else 'one thread'} for torch and FAISS "
              "(flat layouts)")
    for kind, source in sources.items():
        expected = scale.expected_first(data, kind, source)
        flat = kind == "flat"
        variants = [(ONE_PASS, SHARD_FLAGS), (BEFORE, (*SHARD_FLAGS, *scale.BEFORE_SCAN))] if flat else [
            (ONE_PASS, SHARD_FLAGS)]
        starts: dict[str, list[Start]] = {}
        with ExitStack() as stack:
            index_dir = stack.enter_context(scale.layout(source, store, args.shards, work))
            whole = None
            if flat and args.search_r1:
                whole = index_dir if args.shards == 1 else stack.enter_context(scale.layout(source, store, 1, work))
            load = whole is not None and args.concurrency > 0
            for _ in range(args.repeats):
                for name, shard_flags in variants:
                    start = router_start(index_dir, work, data, expected, args, shard_flags, load and name == ONE_PASS)
                    starts.setdefault(name, []).append(start)
                    print(start.line(kind, name), flush=True)
                if whole is not None:
                    start = search_r1_start(whole, work, data, expected, args, load)
                    starts.setdefault(SEARCH_R1, []).append(start)
                    print(start.line(kind, SEARCH_R1), flush=True)
        if load:
            print_loads(kind, starts, args.concurrency, args.load_seconds)
        if whole is not None:
            print_ratios(kind, starts, args.concurrency)


if __name__ == "__main__":
    main()
