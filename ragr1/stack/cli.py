"""``ragr1 up``, ``ragr1 demo`` and ``ragr1 eval``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from ragr1.data import EVAL_BENCHMARKS, TRAIN_SETS
from ragr1.services.common import ports
from ragr1.services.common.config import add_arguments, from_args
from ragr1.services.trainer.config import InformationSettings
from ragr1.stack.config import UpConfig
from ragr1.stack.supervisor import StackError


def _sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so that every ``finally`` stops the child processes."""

    def interrupt(*_: Any) -> NoReturn:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _guarded(run: Any, config: Any) -> int:
    _sigterm_as_interrupt()
    try:
        return int(run(config))
    except StackError as exc:
        print(f"ragr1: {exc}", file=sys.stderr, flush=True)
        return 1


def _up(args: argparse.Namespace) -> int:
    from ragr1.stack.local import up

    return _guarded(up, from_args(UpConfig, args))


def _demo(args: argparse.Namespace) -> int:
    from ragr1.stack.demo import DemoConfig, demo, preset_path

    if args.preset:
        if args.config:
            raise ValueError("give --preset or --config, not both (flags override either)")
        args.config = preset_path(args.preset)
    return _guarded(demo, from_args(DemoConfig, args))


def _eval(args: argparse.Namespace) -> int:
    from ragr1.services.policy.client import PolicyClient
    from ragr1.stack import evaluate

    target = args.policy
    if args.endpoints:
        target = json.loads(Path(args.endpoints).read_text())["services"]["policy"]["grpc"]
    sources = [s for s in args.benchmarks.split(",") if s] + list(args.file or [])
    if not sources:
        raise ValueError("nothing to evaluate: give --benchmarks and/or --file")
    modes = evaluate.parse_modes(args.mode)
    sets = {str(s): evaluate.load_questions(s, args.limit) for s in sources}  # bad files fail before any work
    with PolicyClient(target) as policy:
        if args.checkpoint:
            version = policy.weight_version().version + 1
            update = policy.update_weights(version, str(Path(args.checkpoint).resolve()))
            print(f"serving {args.checkpoint} as version {update.version}", flush=True)
        summaries, records = [], []
        for name, questions in sets.items():
            for mode in modes:
                rollouts, seconds = evaluate.run_questions(
                    lambda tasks: policy.rollout(tasks), questions, mode, batch_size=args.batch_size
                )
                summary = evaluate.summarise(Path(name).name.split(".")[0], mode, rollouts, seconds)
                summaries.append(summary)
                records += [{"benchmark": summary.benchmark, "mode": mode, **evaluate.rollout_record(r)}
                            for r in rollouts]
                print(evaluate.format_table([summary.row()]).splitlines()[-1], flush=True)
    print("\n" + evaluate.format_table([s.row() for s in summaries]))
    if args.out:
        report = {"summaries": [dataclasses.asdict(s) for s in summaries], "questions": records}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwritten to {args.out}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from ragr1.stack.prepare import prepare

    sources = [s for s in args.train_files.split(",") if s]
    done = prepare(sources, Path(args.out), from_args(InformationSettings, args), args.model, args.limit)
    print(f"{done.questions} questions -> {done.prompts}, {done.parquet['single']}, {done.parquet['multi']}")
    print(f"{done.trajectories} SFT trajectories (single and multi-query) -> {done.sft}")
    return 0


def register(commands: Any, serve: Any) -> None:
    from ragr1.stack.demo import DemoConfig

    up = commands.add_parser("up", help="start the whole stack as local processes until Ctrl-C")
    add_arguments(up, UpConfig)
    up.set_defaults(run=_up)

    demo = commands.add_parser(
        "demo", help="the stack, then base / SFT / RL stages, each evaluated on the same held-out questions"
    )
    add_arguments(demo, DemoConfig)
    demo.add_argument("--preset", default="",
                      help="quick (a smoke run, minutes) or long (hours: RL long enough to move held-out EM); "
                           "a YAML file of settings under ragr1/stack/presets/, overridden by flags")
    demo.set_defaults(run=_demo)

    ev = commands.add_parser("eval", help="evaluate the served policy on benchmarks through the running stack")
    ev.add_argument("--policy", default=f"127.0.0.1:{ports.POLICY}", help="policy gRPC address")
    ev.add_argument("--endpoints", default="", help="endpoints.json of `ragr1 up` (overrides --policy)")
    ev.add_argument("--benchmarks", default="",
                    help=f"comma-separated, of: {', '.join(EVAL_BENCHMARKS)}")
    ev.add_argument("--file", nargs="*", help="JSONL files in the same layout (question, golden_answers)")
    ev.add_argument("--limit", type=int, default=None, help="first N questions of each")
    ev.add_argument("--mode", default="multi",
                    help="none (no retrieval), single, multi, a comma-separated list, both (single,multi) or all")
    ev.add_argument("--batch-size", type=int, default=16, help="questions per Policy.Rollout call")
    ev.add_argument("--checkpoint", default="", help="load this checkpoint into the policy first")
    ev.add_argument("--out", default="", help="write the summaries and every question's answer and scores as JSON here")
    ev.set_defaults(run=_eval)

    data = commands.add_parser("data", help="prepare training data").add_subparsers(
        dest="data_command", required=True, metavar="ACTION")
    prep = data.add_parser("prepare", help="RL prompt files (JSONL + Search-R1 parquet) and SFT trajectories")
    prep.add_argument("--train-files", default=",".join(TRAIN_SETS),
                      help="shipped sets and/or JSONL files with question, golden_answers, paragraphs")
    prep.add_argument("--out", default="runs/data", help="output folder")
    prep.add_argument("--limit", type=int, default=None, help="first N questions of each file")
    prep.add_argument("--model", default="", help="the policy's --model, whose tokenizer cuts the information blocks; "
                                                  "empty: SmolLM2-135M-Instruct from its package")
    add_arguments(prep, InformationSettings)
    prep.set_defaults(run=_prepare)
