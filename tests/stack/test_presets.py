"""The demo's presets are files of settings under the names of the configs they feed (``sft:`` is
``ragr1 train sft``'s ``SFTConfig``, ``ppo:`` ``ragr1 train ppo``'s ``PPOConfig``, ``eval:`` ``ragr1 eval``'s),
checked by the same validation as the flags: a misspelt key stops the demo at start, naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ragr1.services.common.config import load
from ragr1.services.trainer.config import PPOConfig, SFTConfig
from ragr1.stack.config import EvalSettings
from ragr1.stack.demo import DEFAULT_PRESET, PRESETS, DemoConfig, demo_config, preset_files

NAMED = sorted(p.stem for p in PRESETS.glob("*.yaml"))


def keys(data: dict[str, object], prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        out |= keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return out


@pytest.mark.parametrize("preset", NAMED)
def test_every_preset_loads_and_every_key_is_a_setting_it_sets(preset: str) -> None:
    config = demo_config(preset)
    data = yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())
    for key in keys(data):
        value: object = config
        for part in key.split("."):
            value = getattr(value, part)
        expected = data
        for part in key.split("."):
            expected = expected[part]  # type: ignore[index]
        assert value == expected, key  # the preset's value reached the setting of that name


@pytest.mark.parametrize("preset", NAMED)
def test_every_presets_loop_fits_the_policys_context(preset: str) -> None:
    from ragr1.services.policy.config import PolicyConfig

    c = demo_config(preset)
    PolicyConfig(max_turns=c.max_turns, max_tokens_per_turn=c.max_tokens_per_turn,
                 tokens_per_query=c.tokens_per_query, max_model_len=c.max_model_len)  # refused if it cannot


def test_the_sections_are_the_stage_commands_own_configs() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(DemoConfig)}
    config = demo_config()
    assert (type(config.sft), type(config.ppo), type(config.eval)) == (SFTConfig, PPOConfig, EvalSettings)
    assert {"sft", "ppo", "eval"} <= set(fields)
    # No setting of a stage is renamed at the top level (the old rl_lr, sft_epochs, eval_batch, ...).
    stage_names = {f.name for cls in (SFTConfig, PPOConfig, EvalSettings) for f in dataclasses.fields(cls)}
    renamed = {name for name in fields for prefix in ("sft_", "rl_", "eval_")
               if name.startswith(prefix) and name.removeprefix(prefix) in stage_names}
    assert not renamed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rl_updates: 3\n", r"unknown settings \['rl_updates'\]"),
        ("ppo:\n  max_update: 3\n", r"\['ppo.max_update'\]; ppo.max_update: did you mean ppo.max_updates"),
        ("sft:\n  learning_rate: 1.0e-5\n", r"unknown settings \['sft.learning_rate'\]"),
        ("ppo:\n  port: 6000\n", r"ppo.port is not a setting of this command"),
        ("ppo:\n  samples_per_prompt: 3\n", r"ppo: batch_size \(8\) must be a multiple of samples_per_prompt \(3\)"),
    ],
)
def test_a_bad_key_or_value_in_a_preset_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "mine.yaml"
    file.write_text(text)
    with pytest.raises(ValueError, match=message):
        load(DemoConfig, file=preset_files("", file), env={})


def test_a_preset_sits_over_the_default_and_flags_and_environment_over_both(tmp_path: Path) -> None:
    default, quick = demo_config(DEFAULT_PRESET), demo_config("quick")
    assert quick.ppo.advantage == default.ppo.advantage == "grpo"  # the default's, kept under quick
    assert quick.ppo.max_updates < default.ppo.max_updates
    files = preset_files("quick")
    env = load(DemoConfig, file=files, env={"RAGR1_PPO__MAX_UPDATES": "3", "RAGR1_SFT__LR": "2e-5"})
    assert (env.ppo.max_updates, env.sft.lr, env.ppo.batch_size) == (3, 2e-5, quick.ppo.batch_size)
    flag = load(DemoConfig, file=files, env={"RAGR1_PPO__MAX_UPDATES": "3"}, overrides={"ppo.max_updates": "2"})
    assert flag.ppo.max_updates == 2
    with pytest.raises(ValueError, match="--preset or --config"):
        preset_files("quick", tmp_path / "mine.yaml")
    with pytest.raises(ValueError, match="no demo preset 'fast'; presets: default, long, quick, rag-r1, search-r1"):
        preset_files("fast")
