"""Which phases ``ragr1 demo`` runs: all of them, or, with ``--sft-checkpoint``, RL on an earlier SFT model
without evaluating the base model or training SFT again. The stack and the policy are test doubles here
(the whole recipe runs for real in tests/e2e/test_demo.py); this checks the recipe's order and the versions
it announces, in a real Redis, for the replicas to load; and how RL's end is read from the trainer's exit code,
the one that ran out of signal evaluated where it stopped."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import redis
from safetensors.numpy import save_file

from ragr1.services.common import fleet
from ragr1.services.common.redis_server import RedisServer
from ragr1.services.trainer.config import NO_SIGNAL_EXIT_CODE, PPOConfig
from ragr1.services.trainer.steplog import StepLog
from ragr1.stack import demo as demo_module
from ragr1.stack import report
from ragr1.stack.demo import Demo, DemoConfig
from ragr1.stack.supervisor import StackError
from ragr1.v1 import policy_pb2


class FakeSupervisor(contextlib.nullcontext):
    def __init__(self, redis_server: RedisServer) -> None:
        super().__init__()
        self.redis = redis_server

    def endpoints(self) -> dict[str, Any]:
        return {"services": {}}


class FakePolicy:
    """A replica that serves whatever version Redis announces last (the rollout worker's follower, in one
    step), or what RL trained to."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.trained = 0

    def __enter__(self) -> FakePolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def version(self) -> int:
        latest = fleet.latest(self.client)
        return max(self.trained, latest.version if latest is not None else 0)

    def weight_version(self) -> policy_pb2.GetWeightVersionResponse:
        return policy_pb2.GetWeightVersionResponse(version=self.version)


def a_checkpoint(path: Path) -> Path:
    """A directory the demo takes for a checkpoint: a config and one weights file."""
    path.mkdir()
    (path / "config.json").write_text("{}")
    save_file({"w": np.arange(4, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def _run(
    config: DemoConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer,
) -> tuple[list[str], list[tuple[int, str]]]:
    """Runs the recipe; returns the phases it ran and the versions announced in Redis (version, path)."""
    calls: list[str] = []
    policies: list[FakePolicy] = []
    client = redis_server.client()
    client.flushall()

    def policy_client(target: str) -> FakePolicy:
        policies.append(FakePolicy(client))
        return policies[-1]

    monkeypatch.setattr(demo_module, "PolicyClient", policy_client)
    runner = Demo(config)
    monkeypatch.setattr(runner, "start", lambda: FakeSupervisor(redis_server))
    monkeypatch.setattr(runner, "evaluate", lambda stage, policy: calls.append(f"evaluate {stage}"))
    def sft() -> Path:
        calls.append("sft")
        return tmp_path / "new-sft"

    monkeypatch.setattr(runner, "sft", sft)

    def rl(supervisor: Any, start: Path, start_version: int) -> int:
        calls.append(f"rl from {start.name} v{start_version}")
        policies[-1].trained = start_version + config.ppo.max_updates
        return policies[-1].trained

    monkeypatch.setattr(runner, "rl", rl)
    monkeypatch.setattr(runner, "wait_for_idle_workers", lambda supervisor: None)
    monkeypatch.setattr(runner, "report", lambda latencies, sft, seconds: {})
    monkeypatch.setattr(demo_module.report, "service_latencies", lambda metrics: {})
    runner.run()
    announced = [fleet.Announcement.read(e, f) for e, f in client.xrange(fleet.WEIGHTS)]  # type: ignore[union-attr]
    client.close()
    return calls, [(a.version, a.path) for a in announced]


def test_the_whole_recipe_evaluates_every_stage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer
) -> None:
    a_checkpoint(tmp_path / "new-sft")
    calls, announced = _run(DemoConfig(run_dir=str(tmp_path / "run")), monkeypatch, tmp_path, redis_server)
    assert calls == ["evaluate base", "sft", "evaluate sft", "rl from new-sft v1", "evaluate rl"]
    assert announced == [(1, str(tmp_path / "new-sft"))]


def test_an_earlier_sft_model_skips_base_and_sft(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer
) -> None:
    earlier = a_checkpoint(tmp_path / "earlier-sft")
    config = DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(earlier))
    calls, announced = _run(config, monkeypatch, tmp_path, redis_server)
    assert calls == ["evaluate sft", "rl from earlier-sft v1", "evaluate rl"]
    assert announced == [(1, str(earlier))]


def test_a_path_that_is_not_a_checkpoint_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"sft_checkpoint .*missing: no such directory"):
        DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"sft_checkpoint .*empty: no config.json there"):
        DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(tmp_path / "empty"))
    assert not (tmp_path / "run").exists()


class ExitedTrainer:
    """The trainer's process once it has ended with ``code``."""

    def __init__(self, code: int, log_path: Path) -> None:
        self.process = SimpleNamespace(returncode=code)
        self.log_path = log_path

    def alive(self) -> bool:
        return False


class TrainerOnlySupervisor:
    def __init__(self, code: int, log_path: Path) -> None:
        self.trainer = ExitedTrainer(code, log_path)

    def add(self, spec: Any) -> ExitedTrainer:
        return self.trainer


def _rl_after(code: int, updates_recorded: int, tmp_path: Path) -> tuple[Demo, int]:
    ppo = PPOConfig(max_updates=6, batch_size=8, samples_per_prompt=4, max_uniform_groups=40)
    config = DemoConfig(run_dir=str(tmp_path / "run"), ppo=ppo)
    runner = Demo(config)
    runner.rl_file = tmp_path / "rl.jsonl"
    steps = StepLog(runner.directory / "rl" / "steps.jsonl")
    for version in range(2, 2 + updates_recorded):
        steps.write({"version": version})
    return runner, runner.rl(TrainerOnlySupervisor(code, tmp_path / "trainer.log"), tmp_path / "sft", start_version=1)


def test_rl_that_runs_out_of_signal_is_evaluated_where_it_stopped_and_the_report_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner, version = _rl_after(NO_SIGNAL_EXIT_CODE, 4, tmp_path)
    assert version == 5  # the SFT version and the four updates the trainer recorded and announced
    assert runner.rl_stopped is not None
    assert (runner.rl_stopped["updates"], runner.rl_stopped["max_updates"]) == (4, 6)
    assert "update 5 sampled 40 groups (ppo.max_uniform_groups) and every one scored alike" in runner.rl_stopped[
        "reason"]
    assert "RL stopped after 4 of 6 updates" in capsys.readouterr().out
    # And the report's RL lines end with it.
    last = report.rl_lines([], "em", True, runner.rl_stopped)[-1]
    assert last.startswith("RL stopped after 4 of 6 updates: update 5")


def test_rl_whose_trainer_failed_or_finished_is_told_apart_from_one_out_of_signal(tmp_path: Path) -> None:
    runner, version = _rl_after(0, 6, tmp_path / "finished")
    assert version == 7 and runner.rl_stopped is None
    with pytest.raises(StackError, match=r"the trainer exited with code 1; its log is .*trainer.log"):
        _rl_after(1, 2, tmp_path / "failed")
