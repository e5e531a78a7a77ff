"""``ragr1 demo``: the whole system training a real model to search, one stage at a time.

A recipe in phases over the local stack:

1. **setup**: held-out, SFT and RL questions (multi-hop, no yes/no, three disjoint sets), the index, every
   service;
2. **evaluate** the base model;
3. **SFT** (``ragr1 train sft``, format learning), pushed to the policy as version 1, then evaluate;
4. **RL** (``ragr1 train ppo``) through the real queue: prompts to Redis, rollout workers, rollouts back,
   weights pushed after every update; then evaluate;
5. **report**: one row per stage, source and mode, with 95% bootstrap intervals, the best constant answer
   of each source, paired stage-to-stage gains, and the plots.

Every evaluation runs the same held-out questions greedily in three modes (no retrieval, single-query,
multi-query), with nothing else running on the policy, so each stage's effect is visible on its own.
Presets (``--preset quick``) are YAML files of settings beside this module, over ``default.yaml`` (the demo's
own choices); flags override them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ragr1.errors import ServiceCallError
from ragr1.model_paths import find_model, policy_checkpoint
from ragr1.services.common import fleet, lifeline
from ragr1.services.common.config import check_at_least, check_choice, flags, load, section, setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import PROMPTS, WORKERS, QueueConfig, StreamQueue
from ragr1.services.policy.client import PolicyClient
from ragr1.services.trainer.client import TrainerClient
from ragr1.services.trainer.config import NO_SIGNAL_EXIT_CODE, PPOConfig, SFTConfig
from ragr1.services.trainer.steplog import StepLog
from ragr1.stack import evaluate, report, stats, wiring
from ragr1.stack.config import EvalSettings, StackConfig
from ragr1.stack.gains import (
    EVAL_MODES,
    GAIN_STAGES,
    StageResult,
    held_out_gain,
    mode_differences,
    mode_lines,
    refused_gains,
    stage_gains,
    type_rows,
    type_table,
)
from ragr1.stack.local import run_dir, start_stack
from ragr1.stack.questions import Split, split_questions, write_jsonl
from ragr1.stack.supervisor import ServiceSpec, StackError, Supervisor
from ragr1.v1 import common_pb2

PRESETS = Path(__file__).resolve().parent / "presets"
# The demo's own choices (sizes for two CPU cores, GRPO, dynamic sampling), under every other preset.
DEFAULT_PRESET = "default"
# The version the SFT weights are announced as; RL trains on from it (the base model is version 0).
SFT_VERSION = 1
# The rollout workers' consumer group on the prompts stream (the policy's default).
# What the demo sets on its ``ragr1 train sft`` and ``ragr1 train ppo`` itself: where they run, what they
# start from and write, its own question files, and the information blocks, which must be the policy's.
SFT_SET_BY_DEMO = ("model", "train_files", "limit", "modes", "top_k", "tokens_per_query", "output_dir",
                   "retriever_address", "max_turns")
PPO_SET_BY_DEMO = (
    *(f.name for f in dataclasses.fields(ServerConfig) if f.name != "log_level"),
    *(f.name for f in dataclasses.fields(QueueConfig)),
    "port", "model", "output_dir", "threads", "prompts_file", "start_version",
)


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
        raise ValueError(f"no demo preset {name!r}; presets: {known}")
    return path


def preset_files(preset: str = DEFAULT_PRESET, file: Path | None = None) -> list[Path]:
    """The config files of a demo run, later over earlier: the default preset, then ``preset`` or a file of
    the user's."""
    if preset and file is not None:
        raise ValueError("give --preset or --config, not both (flags override either)")
    top = [file] if file is not None else [preset_path(preset)] if preset and preset != DEFAULT_PRESET else []
    return [preset_path(DEFAULT_PRESET), *top]


@dataclasses.dataclass
class DemoConfig(StackConfig):
    """``ragr1 demo``: the stack's settings, the questions, and the settings of each stage in a section
    named for the command it runs (``sft``: ``ragr1 train sft``, ``ppo``: ``ragr1 train ppo``, ``eval``:
    ``ragr1 eval``), under that command's own names. The demo's values are the ``default`` preset's."""

    # Held-out questions from the distributions RL trains on: RL is measured where it can learn, not on a
    # benchmark it never trained on.
    sources: list[str] = setting(lambda: ["popqa", "hotpotqa"],
                                 "question sources (training files with paragraphs; popqa: its birthplaces)",
                                 factory=True)
    eval_questions: int = setting(10, "held-out questions per source, evaluated in every mode after every stage")
    gain_questions: int = setting(
        0, "more held-out questions per source (after RL's), evaluated after SFT and after RL in the mode RL "
        "trains only: the SFT -> RL gain on more questions than every mode's evaluation affords",
    )
    train_questions: int = setting(26, "SFT questions per source (a single- and a multi-query trajectory each, "
                                   "kept where its search showed an answer)")
    rl_questions: int = setting(16, "RL prompt questions per source, disjoint from SFT's and evaluation's")
    # RAG-R1 mixes NQ's single-hop questions into its RL set; the shipped NQ questions have no passages in
    # the shipped corpus, PopQA's birthplaces have theirs, and the 135M model answers them sometimes, so
    # more GRPO groups score unevenly (a signal). In the long preset's ablation the held-out gain came with them.
    rl_sources: list[str] = setting(
        lambda: ["popqa", "hotpotqa"], "sources of the RL prompts (empty: --sources; popqa: its birthplaces)",
        factory=True,
    )
    balance_types: bool = setting(True, "each source's questions taking turns by question type before the split "
                                  "(HotpotQA's bridge and comparison ones in every set); off: in file order")
    quick_index: bool = setting(False, "index only the paragraphs of the demo's questions (minutes saved)")
    sft_checkpoint: str = setting(
        "",
        "RL on an earlier run's SFT model (its sft/checkpoints/v000001/policy, from a run with the same questions): "
        "skips evaluating the base model and SFT, for RL ablations on one SFT model",
    )
    sft: SFTConfig = section(SFTConfig, "`ragr1 train sft` of the SFT stage", managed=SFT_SET_BY_DEMO)
    ppo: PPOConfig = section(PPOConfig, "`ragr1 train ppo` of the RL stage (batch_size / samples_per_prompt "
                             "prompts per update, max_updates updates)", managed=PPO_SET_BY_DEMO)
    eval: EvalSettings = section(EvalSettings, "`ragr1 eval` of every stage's evaluation")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("eval_questions", 1), ("train_questions", 1), ("rl_questions", 1),
                              ("gain_questions", 0)))
        check_choice("ppo.mode", self.ppo.mode, ("single", "multi"))
        if self.ppo.max_updates < 1:
            raise ValueError(f"ppo.max_updates must be at least 1 (the demo's RL ends), got {self.ppo.max_updates}")
        if self.sft_checkpoint:
            find_model(self.sft_checkpoint, "sft_checkpoint")  # refused here, naming what it holds


def demo_config(preset: str = DEFAULT_PRESET, **settings: Any) -> DemoConfig:
    """A demo's settings as ``ragr1 demo --preset <preset>`` makes them, ``settings`` (dotted names for a
    section's, as flags) over the preset and no environment."""
    return load(DemoConfig, file=preset_files(preset), env={}, overrides=settings)


def train_sft(args: Sequence[str], out: Path, log: Path, env: Mapping[str, str] | None = None) -> Path:
    """``ragr1 ARGS`` (a ``train sft`` writing under ``out``) as a child process, its output in ``log``, ``env`` added
    to its environment (a stack's auth, for its retriever client); returns the policy folder of the checkpoint it
    wrote."""
    # With a lifeline, as the services have: a run killed mid-SFT must not leave the training running.
    lifeline_env, lifeline_fds = lifeline.for_child()
    with open(log, "ab") as handle:
        result = subprocess.run([sys.executable, "-m", "ragr1", *args], stdout=handle, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {}), **lifeline_env}, pass_fds=lifeline_fds)
    if result.returncode != 0:
        raise StackError(f"SFT failed (exit code {result.returncode}); its log is {log}")
    # Here, not at the top: the checkpoints are torch's, and ``ragr1 --help`` (which reads this module's
    # DemoConfig) must not load torch (the reward and retriever images have none).
    from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir

    latest = Checkpointer(out / "checkpoints").latest()
    if latest is None:
        raise StackError(f"SFT wrote no checkpoint under {out}; its log is {log}")
    return policy_dir(latest[0])


class Demo:
    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.directory = run_dir(config)
        self.ports = wiring.Ports.of(config)
        self.phases: dict[str, float] = {}
        self.stages: list[StageResult] = []
        self.gain_set: list[evaluate.Question] = []
        # Set when RL ended before ``ppo.max_updates`` because an update found no group to train on.
        self.rl_stopped: dict[str, Any] | None = None

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(time.perf_counter() - start, 1)

    # -- setup ----------------------------------------------------------------------------------
    def questions(self) -> Split:
        c = self.config
        split = split_questions(c.eval_questions, c.train_questions, sources=c.sources, rl_per_source=c.rl_questions,
                                rl_sources=c.rl_sources or None, gain_per_source=c.gain_questions,
                                balance_types=c.balance_types)
        data_dir = self.directory / "data"
        self.eval_file = write_jsonl(split.eval, data_dir / "eval.jsonl")
        self.train_file = write_jsonl(split.train, data_dir / "train.jsonl")
        self.rl_file = write_jsonl(split.rl, data_dir / "rl.jsonl")
        self.eval_set = evaluate.load_questions(self.eval_file)
        self.gain_file = write_jsonl(split.gain, data_dir / "gain.jsonl")
        self.gain_set = evaluate.load_questions(self.gain_file) if split.gain else []
        return split

    def start(self) -> Supervisor:
        c = self.config
        self.model = policy_checkpoint(c.model)
        split = self.questions()
        trainer = wiring.trainer_spec(c, self.ports, self.model, self.directory)  # its ports checked up front
        return start_stack(c, self.directory, reserved=[trainer], model=self.model,
                           index_ids=split.passage_ids() if c.quick_index else None)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, stage: str, policy: PolicyClient) -> StageResult:
        c = self.config
        version = policy.weight_version().version
        info = policy.info()
        # Every mode on the held-out questions; after SFT and after RL, the mode RL trains on the more held-out ones.
        sets: list[tuple[list[evaluate.Question], Sequence[str]]] = [(self.eval_set, EVAL_MODES)]
        if stage in GAIN_STAGES and self.gain_set:
            sets.append((self.gain_set, (c.ppo.mode,)))
        found: list[tuple[list[evaluate.EvalSummary], list[dict[str, Any]]]] = []
        every: list[common_pb2.Rollout] = []
        start = time.perf_counter()
        total = sum(len(questions) * len(modes) for questions, modes in sets)
        with tqdm(total=total, desc=f"evaluate {stage}", unit=" q") as bar:
            for questions, modes in sets:
                summaries: list[evaluate.EvalSummary] = []
                records: list[dict[str, Any]] = []
                by_mode = evaluate.run_questions(
                    lambda tasks: policy.rollout(tasks), questions, modes, batch_size=c.eval.batch_size,
                    run=stage, progress=bar.update,
                )
                for mode, (rollouts, seconds) in by_mode.items():
                    summaries += evaluate.summarise_sources(mode, rollouts, seconds)
                    records += [{"stage": stage, **evaluate.rollout_record(r)} for r in rollouts]
                    every += rollouts
                found.append((summaries, records))
        (summaries, records), *more = found
        gain_summaries, gain_records = more[0] if more else ([], [])
        result = StageResult(stage, version, summaries, records, time.perf_counter() - start,
                             evaluate.provenance(info, every), gain_summaries, gain_records)
        print(f"{stage}: {evaluate.provenance_line(result.provenance)}", flush=True)
        self.stages.append(result)
        return result

    def announce(self, supervisor: Supervisor, version: int, checkpoint: Path) -> None:
        """Announces ``checkpoint`` as ``version`` in the stack's Redis, the route every weight version takes to
        the replicas (the trainer's own included: it starts from this version and finds it announced)."""
        assert supervisor.redis is not None
        client = supervisor.redis.client()
        try:
            fleet.announce_checkpoint(client, version, checkpoint.resolve())
        finally:
            client.close()

    def wait_for_version(self, policy: PolicyClient, version: int, timeout: float = 600.0) -> None:
        """Waits until the policy serves ``version``: the rollout worker loads an announced version after the
        rollouts it holds have finished on the version before."""
        deadline = time.monotonic() + timeout
        while (served := policy.weight_version().version) < version:
            if time.monotonic() > deadline:
                raise StackError(f"the policy serves version {served} {timeout:.0f} s after RL, expected {version}")
            time.sleep(1.0)
        if served != version:
            raise StackError(f"the policy serves version {served}, expected {version} after RL")

    def wait_for_idle_workers(self, supervisor: Supervisor, timeout: float = 600.0) -> None:
        """Evaluation must not share the engine with rollouts: waits until no prompt is in flight."""
        assert supervisor.redis is not None
        client = supervisor.redis.client()
        prompts: StreamQueue[Any] = StreamQueue(client, PROMPTS, common_pb2.PromptTask, group=WORKERS)
        deadline = time.monotonic() + timeout
        while prompts.pending() or prompts.undelivered():
            if time.monotonic() > deadline:
                raise StackError(f"rollout workers still busy after {timeout:.0f} s; see {supervisor.log_dir}")
            time.sleep(1.0)
        client.close()

    # -- training -------------------------------------------------------------------------------
    def sft_args(self, out: Path) -> list[str]:
        """``ragr1 train sft``'s arguments: the demo's SFT questions, both modes, searched through the stack's
        retriever with the loop's block budget and turns."""
        c = self.config
        return ["train", "sft", *flags(SFTConfig, {
            **chosen(c.sft, SFT_SET_BY_DEMO),
            "model": str(self.model), "train_files": [str(self.train_file)], "limit": 0,
            "modes": ["single", "multi"], "tokens_per_query": c.tokens_per_query, "output_dir": str(out),
            "retriever_address": f"{wiring.HOST}:{self.ports.router}", "max_turns": c.max_turns,
        })]

    def sft(self) -> Path:
        """``ragr1 train sft`` of the SFT stage; returns the checkpoint."""
        out = self.directory / "sft"
        log = self.directory / "logs" / "sft.log"
        print(f"SFT (format learning) on {self.train_file.name}; log {log}", flush=True)
        return train_sft(self.sft_args(out), out, log)

    def rl_spec(self, start_checkpoint: Path, start_version: int) -> ServiceSpec:
        """The PPO trainer of the RL stage: the ``ppo`` section on the RL questions, ``ppo.max_updates`` updates."""
        c = self.config
        return wiring.trainer_spec(c, self.ports, start_checkpoint, self.directory / "rl", {
            **chosen(c.ppo, PPO_SET_BY_DEMO), "prompts_file": str(self.rl_file), "start_version": start_version,
        })

    def rl(self, supervisor: Supervisor, start_checkpoint: Path, start_version: int) -> int:
        """The trainer as a service of the stack until it has made ``ppo.max_updates`` updates, or until an update
        found no group to train on (dynamic sampling's bound: the updates before it are evaluated, and the report
        says where RL stopped); returns the version the policy then serves."""
        c = self.config
        self.rl_dir = self.directory / "rl"
        spec = self.rl_spec(start_checkpoint, start_version)
        proc = supervisor.add(spec)
        updates = c.ppo.max_updates
        target = start_version + updates
        trainer = TrainerClient(spec.target)
        with tqdm(total=updates, desc="RL updates") as bar:
            done = 0
            while proc.alive():
                dead = [d for d in supervisor.dead() if d != "trainer"]
                if dead:
                    raise StackError(supervisor.describe_death(dead[0]))
                try:
                    version = int(trainer.status(timeout=5).policy_version)
                except ServiceCallError:  # the trainer stops its server once it is done
                    version = start_version + done
                if version - start_version > done:
                    bar.update(version - start_version - done)
                    done = version - start_version
                time.sleep(2)
            code = proc.process.returncode if proc.process else None
            if code == 0:
                bar.update(updates - done)
        trainer.close()
        if code == NO_SIGNAL_EXIT_CODE:
            # The trainer's records, not the status polls: it announced every version it recorded.
            trained = len(StepLog(self.rl_dir / "steps.jsonl").read())
            self.rl_stopped = {
                "updates": trained, "max_updates": updates,
                "reason": f"update {trained + 1} sampled {c.ppo.max_uniform_groups} groups (ppo.max_uniform_groups) "
                          "and every one scored alike: no group to train on",
                "log": str(proc.log_path),
            }
            print(f"RL stopped after {trained} of {updates} updates: {self.rl_stopped['reason']}; the policy of "
                  f"the last is evaluated (the trainer's log: {proc.log_path})", flush=True)
            return start_version + trained
        if code != 0:
            raise StackError(f"the trainer exited with code {code}; its log is {proc.log_path}")
        return target

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        with self._phase("setup"):
            supervisor = self.start()
        policy_target = f"{wiring.HOST}:{self.ports.policy}"
        with supervisor, PolicyClient(policy_target) as policy:
            if self.config.sft_checkpoint:
                sft_checkpoint = find_model(self.config.sft_checkpoint, "sft_checkpoint")
            else:
                with self._phase("evaluate base"):
                    self.evaluate("base", policy)
                with self._phase("sft"):
                    sft_checkpoint = self.sft()
            self.announce(supervisor, SFT_VERSION, sft_checkpoint)
            self.wait_for_version(policy, SFT_VERSION)
            print(f"policy serves the SFT weights {sft_checkpoint} as version {SFT_VERSION}", flush=True)
            with self._phase("evaluate sft"):
                self.evaluate("sft", policy)
            with self._phase("rl"):
                final_version = self.rl(supervisor, sft_checkpoint, start_version=SFT_VERSION)
                self.wait_for_version(policy, final_version)
                self.wait_for_idle_workers(supervisor)
            with self._phase("evaluate rl"):
                self.evaluate("rl", policy)
            latencies = report.service_latencies(
                {name: info["metrics"] for name, info in supervisor.endpoints()["services"].items()}
            )
        return self.report(latencies, sft_checkpoint, time.perf_counter() - started)

    # -- report ---------------------------------------------------------------------------------
    def baselines(self) -> list[dict[str, Any]]:
        out = []
        for source in self.config.sources:
            golds = [q.golden_answers for q in self.eval_set if q.data_source == source]
            if golds:
                best = stats.best_constant(golds)
                out.append({"source": source, "answer": best.answer, "questions": len(golds),
                            "exact_match": dataclasses.asdict(best.exact_match), "f1": dataclasses.asdict(best.f1)})
        return out

    def table(self, baselines: list[dict[str, Any]]) -> str:
        header = ["stage", *evaluate.HEADER]
        rows = []
        for b in baselines:
            em, f1 = stats.Estimate(**b["exact_match"]), stats.Estimate(**b["f1"])
            rows.append([f"constant {b['answer']!r}", b["source"], "-", str(b["questions"]), str(em), str(f1),
                         "-", "-", "-", "-"])
        for stage in self.stages:
            rows += [[stage.stage, *s.row()] for s in stage.summaries]
        for stage in self.stages:
            rows += [[f"{stage.stage} (more)", *s.row()] for s in stage.gain_summaries]
        return evaluate.format_table(rows, header)

    def report(self, latencies: dict[str, Any], sft_checkpoint: Path, wall_seconds: float) -> dict[str, Any]:
        sft_steps = StepLog(self.directory / "sft" / "sft_steps.jsonl").read()
        rl_steps = StepLog(self.rl_dir / "steps.jsonl").read()
        baselines = self.baselines()
        gains = stage_gains(self.stages, self.config.sources)
        refused = refused_gains(self.stages)
        held_out = held_out_gain(self.stages, self.config.ppo.mode)
        by_type, modes = type_rows(self.stages), mode_differences(self.stages)
        plots = {
            "training": str(report.plot_training(sft_steps, rl_steps, self.directory / "training.png")),
            "latency": str(report.plot_latencies(latencies, self.directory / "latency.png")),
        }
        result = {
            "config": dataclasses.asdict(self.config),
            "wall_seconds": wall_seconds,
            "phase_seconds": self.phases,
            "questions": {"eval": len(self.eval_set), "eval_file": str(self.eval_file),
                          "train_file": str(self.train_file), "rl_file": str(self.rl_file),
                          "gain": len(self.gain_set), "gain_file": str(self.gain_file)},
            # What the final numbers depend on; each stage's own (its checkpoint above all) is in "stages".
            "provenance": self.stages[-1].provenance,
            "stages": [{"stage": s.stage, "policy_version": s.policy_version, "seconds": s.seconds,
                        "provenance": s.provenance, "summaries": [dataclasses.asdict(x) for x in s.summaries],
                        "gain_summaries": [dataclasses.asdict(x) for x in s.gain_summaries]}
                       for s in self.stages],
            "baselines": baselines,
            "by_type": by_type,
            "multi_vs_single": modes,
            "gains": gains,
            "gains_refused": refused,
            "held_out_gain": held_out,
            "policy_version": self.stages[-1].policy_version,
            "rl_stopped": self.rl_stopped,
            "sft_checkpoint": str(sft_checkpoint),
            "sft_steps": sft_steps,
            "rl_steps": [{k: v for k, v in s.items() if k != "rollout_ids"} for s in rl_steps],
            "latency": latencies,
            "plots": plots,
            "rollouts": {s.stage: s.records for s in self.stages},
            "gain_rollouts": {s.stage: s.gain_records for s in self.stages if s.gain_records},
        }
        path = self.directory / "report.json"
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"\nheld-out questions: {len(self.eval_set)} ({', '.join(self.config.sources)}), greedy; "
              "EM and F1 with 95% bootstrap intervals\n", flush=True)
        print(self.table(baselines), flush=True)
        print("\nby question type, the sources pooled:\n" + type_table(by_type), flush=True)
        print("\nmulti- against single-query mode on the same questions (95% intervals):\n"
              + mode_lines(modes), flush=True)
        for line in report.rl_lines(rl_steps, self.config.reward, self.config.ppo.max_uniform_groups > 0,
                                    self.rl_stopped):
            print(line, flush=True)
        for r in refused:
            print(f"\nno paired gains {r['from']} -> {r['to']}: {r['reason']}", flush=True)
        print("\npaired gains on the same questions (95% intervals; all: the sources pooled):", flush=True)
        for g in gains:
            if g["mode"] != "none":
                print(f"  {g['from']:>4} -> {g['to']:<3} {g['source']:<9} {g['mode']:<6} "
                      f"EM {stats.Estimate(**g['exact_match'])}  F1 {stats.Estimate(**g['f1'])}", flush=True)
        if held_out is not None:
            em, f1 = held_out["exact_match"], held_out["f1"]
            was, now = stats.Estimate(**em[held_out["from"]]), stats.Estimate(**em[held_out["to"]])
            print(f"\n{held_out['from']} -> {held_out['to']} in {held_out['mode']} mode (the mode RL trains) on "
                  f"{held_out['questions']} more held-out questions ({', '.join(self.config.sources)} pooled; 'more' "
                  f"rows above): EM {was} -> {now}, gain {stats.Estimate(**em['gain'])}; "
                  f"F1 gain {stats.Estimate(**f1['gain'])}", flush=True)
        print(f"\nreport {path}\nplots  {plots['training']}\n       {plots['latency']}", flush=True)
        print(f"done in {wall_seconds / 60:.1f} min ({', '.join(f'{k} {v / 60:.1f}' for k, v in self.phases.items())})",
              flush=True)
        return result


def chosen(config: Any, set_by_demo: Sequence[str]) -> dict[str, Any]:
    """The settings of a stage's section that differ from its command's defaults: what its command line
    must carry (the demo's own, ``set_by_demo``, left out)."""
    default = type(config)()
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name not in set_by_demo and getattr(config, f.name) != getattr(default, f.name)}


def demo(config: DemoConfig) -> int:
    Demo(config).run()
    return 0

