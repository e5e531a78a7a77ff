"""The settings of ``ragr1 eval`` and ``ragr1 data prepare``: a bad value stops the command with a message
naming the setting, before a policy is called or a file written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval"], "benchmarks and file are both empty: nothing to evaluate"),
        (["eval", "--benchmarks", "nq,squad"], "benchmarks: unknown ['squad']; known: nq, tq"),
        (["eval", "--benchmarks", "nq", "--mode", "multi,sometimes"], "--mode 'multi,sometimes': use none, single"),
        (["eval", "--benchmarks", "nq", "--batch-size", "0"], "batch_size must be at least 1, got 0"),
        (["eval", "--benchmarks", "nq", "--limit", "-1"], "limit must be at least 1, got -1"),
        (["data", "prepare", "--train-files", ""], "train_files is empty"),
        (["data", "prepare", "--top-k", "0"], "top_k must be at least 1, got 0"),
        (["data", "prepare", "--tokens-per-query", "ten"], "config field 'tokens_per_query'"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # data prepare writes under runs/data by default
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
