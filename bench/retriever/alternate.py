"""The 1-client latency of 1-, 2- and 3-question calls through the real router and shards, the shard's one-pass scan
against the shard before it, alternated, so that the machine's drift between two runs does not pass for a
difference between the two.

    PYTHONPATH=. python bench/retriever/alternate.py [--rows 3000000] [--shards 2] [--repeats 2] [--rounds 40]
        [--types flat,ivfpq] --work DIR

``bench/retriever/scale.py`` measures each layout once, one after the other, minutes apart; a 1-question call's
latency (which the scan does not change: one row goes through FAISS's own pass either way) then moves by as much as
a sixth between runs of the same code. Here, for each flat layout, shard processes with the scan
(``--blocked-scan``) and without it (``scale.BEFORE_SCAN``) are started in turn, ``--repeats`` times each, A B A B;
for every other index type, its shards ``--repeats`` times. Each start measures the median of ``--rounds`` calls of
each size at 1 client, interleaved, and the router's time per call in each stage. Uses the sources
``scale.py`` built in ``--work`` (the same file names), building them when missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.retriever import scale
from bench.retriever.throughput import router_process, shard_processes
from ragr1.services.retriever.index import IndexSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000, help="vectors in the index")
    parser.add_argument("--shards", type=int, default=2, help="shards")
    parser.add_argument("--types", default="flat,ivfpq", help="index types, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="starts of each variant, alternated")
    parser.add_argument("--rounds", type=int, default=40, help="1-client rounds (a call of each size each)")
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
    flags = ["--checksum", "off"]
    print(f"{args.rows:,} rows, {args.shards} shards, the real encoder; median ms at 1 client of {args.rounds} calls "
          "of each size; the router's ms per call by stage")
    for kind, source in sources.items():
        variants = [("one-pass scan", flags), ("before the scan", [*flags, *scale.BEFORE_SCAN])]
        if kind != "flat":
            variants = variants[:1]
        with scale.layout(source, store, args.shards, work) as index_dir:
            for _ in range(args.repeats):
                for name, shard_flags in variants:
                    with shard_processes(index_dir, work, shard_flags) as shards, router_process(
                        index_dir, work, shards, "--timeout-s", "300"
                    ) as cluster:
                        medians, stages = scale.call_sizes(cluster, data.questions, args.rounds)
                    one = medians[1]
                    sizes = ", ".join(f"{n}q {ms:6.1f} (x{ms / one:4.2f})" for n, ms in medians.items())
                    split = "; ".join(f"{n}q embed {s.get('embed', float('nan')):5.1f} fanout "
                                      f"{s.get('fanout', float('nan')):6.1f}" for n, s in stages.items())
                    print(f"   {kind:<6} {name:<16} {sizes}   {split}", flush=True)


if __name__ == "__main__":
    main()
