"""``ragr1 up``, ``demo``, ``eval`` and ``data prepare`` take their settings from a file, the environment
and flags (in that order of precedence), as every ``ragr1`` command does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragr1.cli import main
from ragr1.stack import cli
from ragr1.stack.prepare import Prepared


def capture(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """The configs the command ``name`` of ``ragr1.stack.cli`` is run with (it runs nothing)."""
    seen: list[Any] = []
    monkeypatch.setattr(cli, name, lambda config: seen.append(config) or 0)
    return seen


def test_eval_settings_from_a_file_the_environment_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = capture(monkeypatch, "_eval")
    (tmp_path / "eval.yaml").write_text("benchmarks: [nq, popqa]\nlimit: 5\nmode: single\n")
    monkeypatch.setenv("RAGR1_LIMIT", "7")
    monkeypatch.setenv("RAGR1_POLICY", "10.0.0.1:50052")
    assert main(["eval", "--config", str(tmp_path / "eval.yaml"), "--mode", "both", "--file", "a.jsonl,b.jsonl"]) == 0
    (config,) = seen
    assert (config.benchmarks, config.file, config.limit) == (["nq", "popqa"], ["a.jsonl", "b.jsonl"], 7)
    assert (config.policy, config.modes()) == ("10.0.0.1:50052", ["single", "multi"])


def test_data_prepare_passes_every_setting_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def prepare(*args: Any) -> Prepared:
        calls.append(args)
        return Prepared(Path("p"), {"single": Path("s"), "multi": Path("m")}, Path("sft"), 0, 0, 0)

    monkeypatch.setattr("ragr1.stack.prepare.prepare", prepare)
    (tmp_path / "prepare.json").write_text('{"train_files": ["hotpotqa", "mine.jsonl"], "top_k": 5}')
    monkeypatch.setenv("RAGR1_TOKENS_PER_QUERY", "99")
    monkeypatch.setenv("RAGR1_MODEL", "my-model")
    monkeypatch.setenv("RAGR1_RETRIEVER_ADDRESS", "10.0.0.2:50051")
    assert main(["data", "prepare", "--config", str(tmp_path / "prepare.json"), "--limit", "3", "--top-k", "2",
                 "--max-turns", "2"]) == 0
    ((sources, out, blocks, model, limit, retriever, turns),) = calls
    assert (sources, out, blocks.top_k, blocks.tokens_per_query, model, limit, retriever, turns) == (
        ["hotpotqa", "mine.jsonl"], Path("runs/data"), 2, 99, "my-model", 3, "10.0.0.2:50051", 2)


def test_up_and_demo_read_the_same_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    up, demo = capture(monkeypatch, "_up"), capture(monkeypatch, "_demo")
    (tmp_path / "stack.yaml").write_text("num_shards: 3\n")
    monkeypatch.setenv("RAGR1_MAX_TURNS", "3")
    assert main(["up", "--config", str(tmp_path / "stack.yaml"), "--no-trainer"]) == 0
    assert (up[0].num_shards, up[0].max_turns, up[0].trainer) == (3, 3, False)
    # --preset is the file layer of the demo: the quick preset's sizes, the environment's, then flags.
    assert main(["demo", "--preset", "quick", "--eval-questions", "1"]) == 0
    assert (demo[0].quick_index, demo[0].max_turns, demo[0].eval_questions) == (True, 3, 1)


def test_demo_takes_a_preset_or_a_config_file_not_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = capture(monkeypatch, "_demo")
    (tmp_path / "demo.yaml").write_text("eval_questions: 1\n")
    assert main(["demo", "--preset", "quick", "--config", str(tmp_path / "demo.yaml")]) == 2
    assert "give --preset or --config, not both" in capsys.readouterr().err
    assert main(["demo", "--preset", "tiny"]) == 2
    assert "no demo preset 'tiny'" in capsys.readouterr().err
    assert demo == []


def test_a_failed_service_call_is_one_line_naming_the_service_status_and_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``ragr1 eval`` against a policy address where nothing listens: real gRPC, refused connection."""
    from ragr1.services.common.redis_server import free_port

    target = f"127.0.0.1:{free_port()}"
    code = main(["eval", "--policy", target, "--benchmarks", "nq", "--limit", "1", "--mode", "none"])
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # The first call eval makes (Info, for the provenance of its numbers) is the one that fails.
    assert lines[0].startswith(f"ragr1 eval: error: ragr1.v1.Policy/Info at {target}: UNAVAILABLE: "), err
