"""The reward server's settings: defaults, layers, and bad values refused before anything binds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.services.common import config, ports
from ragr1.services.reward.config import RewardConfig
from ragr1.services.reward.format_check import FormatWeights
from ragr1.services.reward.scoring import Composition, RewardSettings


def own(config: object, cls: type) -> dict[str, object]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(cls)}


def test_the_scorers_settings_are_the_configs_own() -> None:
    """No copies: the server hands its config itself to the scorer."""
    cfg = RewardConfig()
    assert cfg.port == ports.REWARD
    assert isinstance(cfg, RewardSettings)
    assert own(cfg, RewardSettings) == own(RewardSettings(), RewardSettings)


def test_search_r1_v03_preset_from_the_environment() -> None:
    cfg = config.load(RewardConfig, env={"RAGR1_SCHEME": "search_r1_v03"})
    v03 = Composition.search_r1_v03()
    assert own(cfg, Composition) == own(v03, Composition)


def test_format_weights_from_a_file_the_environment_and_flags(tmp_path: Path) -> None:
    file = tmp_path / "reward.yaml"
    file.write_text("format_weights: {tags: 0.1, order: 0.2}\n")
    cfg = config.load(RewardConfig, file=file, env={"RAGR1_FORMAT_WEIGHTS__ORDER": "0.3"},
                      overrides={"format_weights.answer": "0.4"})
    assert cfg.format_weights == FormatWeights(tags=0.1, order=0.3, answer=0.4, clean=0.25)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--scheme", "magic"], "scheme must be one of weighted, search_r1_v03"),
        (["--relevance-weight", "1.5"], "relevance_weight must be in [0, 1]"),
        (["--max-items", "0"], "max_items must be at least 1"),
        (["--format-weights.tags", "-1"], "format_weights: format weights must be >= 0"),
    ],
)
def test_bad_settings_stop_the_cli(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "reward", "--port", "0", *flags]) == 2
    assert message in capsys.readouterr().err
