"""Which phases ``ragr1 demo`` runs: all of them, or, with ``--sft-checkpoint``, RL on an earlier SFT model
without evaluating the base model or training SFT again. The stack and the policy are test doubles here
(the whole recipe runs for real in tests/e2e/test_demo.py); this checks the recipe's order and pushes."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from ragr1.stack import demo as demo_module
from ragr1.stack.demo import Demo, DemoConfig
from ragr1.v1 import policy_pb2


class FakeSupervisor(contextlib.nullcontext):
    def endpoints(self) -> dict[str, Any]:
        return {"services": {}}


class FakePolicy:
    def __init__(self, target: str) -> None:
        self.version = 0
        self.pushed: list[tuple[int, str]] = []

    def __enter__(self) -> FakePolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update_weights(self, version: int, path: str) -> policy_pb2.UpdateWeightsResponse:
        self.pushed.append((version, path))
        self.version = version
        return policy_pb2.UpdateWeightsResponse(version=version, seconds=0.1)

    def weight_version(self) -> policy_pb2.GetWeightVersionResponse:
        return policy_pb2.GetWeightVersionResponse(version=self.version)


def _run(config: DemoConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[str], FakePolicy]:
    calls: list[str] = []
    policies: list[FakePolicy] = []

    def policy_client(target: str) -> FakePolicy:
        policies.append(FakePolicy(target))
        return policies[-1]

    monkeypatch.setattr(demo_module, "PolicyClient", policy_client)
    runner = Demo(config)
    monkeypatch.setattr(runner, "start", FakeSupervisor)
    monkeypatch.setattr(runner, "evaluate", lambda stage, policy: calls.append(f"evaluate {stage}"))
    def sft() -> Path:
        calls.append("sft")
        return tmp_path / "new-sft"

    monkeypatch.setattr(runner, "sft", sft)

    def rl(supervisor: Any, start: Path, start_version: int) -> int:
        calls.append(f"rl from {start.name} v{start_version}")
        policies[-1].version = start_version + config.ppo.max_updates
        return policies[-1].version

    monkeypatch.setattr(runner, "rl", rl)
    monkeypatch.setattr(runner, "wait_for_idle_workers", lambda supervisor: None)
    monkeypatch.setattr(runner, "report", lambda latencies, sft, seconds: {})
    monkeypatch.setattr(demo_module.report, "service_latencies", lambda metrics: {})
    runner.run()
    return calls, policies[-1]


def test_the_whole_recipe_evaluates_every_stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls, policy = _run(DemoConfig(run_dir=str(tmp_path / "run")), monkeypatch, tmp_path)
    assert calls == ["evaluate base", "sft", "evaluate sft", "rl from new-sft v1", "evaluate rl"]
    assert policy.pushed == [(1, str(tmp_path / "new-sft"))]


def test_an_earlier_sft_model_skips_base_and_sft(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    earlier = tmp_path / "earlier-sft"
    earlier.mkdir()
    (earlier / "config.json").write_text("{}")
    config = DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(earlier))
    calls, policy = _run(config, monkeypatch, tmp_path)
    assert calls == ["evaluate sft", "rl from earlier-sft v1", "evaluate rl"]
    assert policy.pushed == [(1, str(earlier))]


def test_a_path_that_is_not_a_checkpoint_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"sft_checkpoint .*missing: no such directory"):
        DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"sft_checkpoint .*empty: no config.json there"):
        DemoConfig(run_dir=str(tmp_path / "run"), sft_checkpoint=str(tmp_path / "empty"))
    assert not (tmp_path / "run").exists()
