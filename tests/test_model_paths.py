"""``models.policy_checkpoint``: the model every command serves or trains, from its ``--model``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.model_paths import policy_checkpoint


def test_no_model_is_smollm2_from_its_package(policy_model_dir: Path) -> None:
    assert policy_checkpoint("") == policy_model_dir
    assert (policy_model_dir / "config.json").is_file()


def test_a_checkpoint_directory_is_taken_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path.parent)
    assert policy_checkpoint(tmp_path.name) == tmp_path.resolve()


@pytest.mark.parametrize("command", [["train", "sft"], ["serve", "policy"]])
def test_a_directory_without_config_json_stops_the_command_naming_it(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(FileNotFoundError, match=f"model {re.escape(str(tmp_path))}: no config.json"):
        policy_checkpoint(str(tmp_path))
    assert main([*command, "--model", str(tmp_path)]) == 2
    assert f"model {tmp_path}: no config.json" in capsys.readouterr().err
