"""``ragr1 up``, ``ragr1 scale``, ``ragr1 demo``, ``ragr1 eval`` and ``ragr1 data prepare``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ragr1.services.common.commands import command
from ragr1.stack.config import EvalConfig, PrepareConfig, ScaleConfig, UpConfig

if TYPE_CHECKING:
    from ragr1.stack.demo import DemoConfig

C = TypeVar("C")


def _sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so that every ``finally`` stops the child processes."""

    def interrupt(*_: Any) -> NoReturn:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _guarded(run: Callable[[C], int], config: C) -> int:
    _sigterm_as_interrupt()
    return int(run(config))


def _up(config: UpConfig) -> int:
    from ragr1.stack.local import up

    return _guarded(up, config)


def _demo(config: DemoConfig) -> int:
    from ragr1.stack.demo import demo

    return _guarded(demo, config)


def _demo_preset(args: argparse.Namespace) -> None:
    """``--preset NAME`` is the config file ``ragr1/stack/presets/NAME.yaml``, over ``default.yaml``, as
    is a ``--config`` file."""
    from ragr1.stack.demo import preset_files

    args.config = preset_files(args.preset, args.config)


def policy_target(endpoints: str, policy: str) -> str:
    """The policy's address: the one in ``ragr1 up``'s endpoints.json, or ``policy`` without one."""
    if not endpoints:
        return policy
    path = Path(endpoints)
    try:
        return str(json.loads(path.read_text())["services"]["policy"]["grpc"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"endpoints {path}: not the endpoints.json of `ragr1 up` (no services.policy.grpc in it)"
        ) from exc


def _eval(config: EvalConfig) -> int:
    from ragr1.model_paths import find_model
    from ragr1.services.policy.client import PolicyClient
    from ragr1.stack import evaluate

    # Every input is checked before the policy is called: bad files, a checkpoint folder with no model.
    target = policy_target(config.endpoints, config.policy)
    sources = [*config.benchmarks, *config.file]
    modes = config.modes()
    sets = {s: evaluate.load_questions(s, config.limit) for s in sources}
    checkpoint = find_model(config.checkpoint, "checkpoint") if config.checkpoint else None
    with PolicyClient(target) as policy:
        if checkpoint is not None:
            version = policy.weight_version().version + 1
            update = policy.update_weights(version, str(checkpoint))
            print(f"serving {checkpoint} as version {update.version}", flush=True)
        info = policy.info()  # after the checkpoint load: the weights the numbers come from
        summaries, records, every = [], [], []
        for name, questions in sets.items():
            by_mode = evaluate.run_questions(
                lambda tasks: policy.rollout(tasks), questions, modes, batch_size=config.batch_size
            )
            for mode, (rollouts, seconds) in by_mode.items():
                every += rollouts
                # Per data source: a Search-R1 test.parquet mixes the seven benchmarks in one file.
                benchmark = Path(name).name.split(".")[0]
                mine = evaluate.summarise_sources(
                    mode, rollouts, seconds, search_r1_names="search-r1" in modes, benchmark=benchmark
                )
                summaries += mine
                records += [{"benchmark": benchmark, "mode": mode, **evaluate.rollout_record(r)} for r in rollouts]
                for summary in mine:
                    print(evaluate.format_table([summary.row()]).splitlines()[-1], flush=True)
    provenance = evaluate.provenance(info, every)
    print("\n" + evaluate.format_table([s.row() for s in summaries]))
    print(evaluate.provenance_line(provenance))
    if config.out:
        report = {"provenance": provenance, "summaries": [dataclasses.asdict(s) for s in summaries],
                  "questions": records}
        Path(config.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwritten to {config.out}")
    return 0


def _scale(config: ScaleConfig) -> int:
    from ragr1.stack.scale import scale

    replicas = scale(config)
    print(f"{len(replicas)} policy replicas serving: " + ", ".join(f"{n} {t}" for n, t in replicas.items()))
    return 0


def _prepare(config: PrepareConfig) -> int:
    from ragr1.stack.prepare import prepare

    done = prepare(config.train_files, Path(config.out), config, config.model, config.limit,
                   config.retriever_address, config.max_turns)
    print(f"{done.questions} questions -> {done.prompts}, {done.parquet['single']}, {done.parquet['multi']}")
    print(f"{done.trajectories} of {done.searched} SFT trajectories (single and multi-query) showed an answer "
          f"-> {done.sft}")
    return 0


def register(commands: Any, serve: Any) -> None:
    from ragr1.stack.demo import DemoConfig

    command(commands, "up", UpConfig, _up, help="start the whole stack as local processes until Ctrl-C")
    command(commands, "scale", ScaleConfig, _scale,
            help="add or remove policy replicas of a running `ragr1 up`; new ones load the current weights "
                 "before they take a prompt")
    demo = command(
        commands, "demo", DemoConfig, _demo, prepare=_demo_preset,
        help="the stack, then base / SFT / RL stages, each evaluated on the same held-out questions; the demo's "
             "own values are ragr1/stack/presets/default.yaml's, over the defaults below",
    )
    demo.add_argument("--preset", default="",
                      help="quick (a smoke run, minutes), long (hours: RL long enough to move held-out EM), "
                           "search-r1 or rag-r1 (their published PPO hyperparameters; what these machines cannot "
                           "honour is listed in the file); "
                           "a YAML file of settings under ragr1/stack/presets/, over default.yaml (the demo's "
                           "own choices), overridden by flags")
    command(
        commands, "eval", EvalConfig, _eval,
        help="evaluate the served policy on benchmarks through the running stack",
    )
    data = commands.add_parser("data", help="prepare training data").add_subparsers(
        dest="data_command", required=True, metavar="ACTION")
    command(
        data, "prepare", PrepareConfig, _prepare,
        help="RL prompt files (JSONL + Search-R1 parquet) and SFT trajectories",
    )
