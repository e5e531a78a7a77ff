"""``ragr1 train sft`` takes its settings from a file, the environment and flags, as every command does."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.services.trainer.config import SFTConfig


def test_sft_settings_from_a_file_the_environment_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[SFTConfig] = []

    class Trainer:
        def __init__(self, config: SFTConfig) -> None:
            seen.append(config)

        def train(self) -> Path:
            return tmp_path / "checkpoint"

    monkeypatch.setattr("ragr1.services.trainer.sft.SFTTrainer", Trainer)
    (tmp_path / "sft.yaml").write_text("train_files: [musique, mine.jsonl]\nepochs: 2\nlr: 0.1\n")
    monkeypatch.setenv("RAGR1_LR", "0.002")
    assert main(["train", "sft", "--config", str(tmp_path / "sft.yaml"), "--modes", "multi", "--epochs", "3"]) == 0
    (config,) = seen
    assert (config.train_files, config.modes) == (["musique", "mine.jsonl"], ["multi"])
    assert (config.lr, config.epochs) == (0.002, 3)
    assert f"SFT checkpoint: {tmp_path / 'checkpoint'}" in capsys.readouterr().out
