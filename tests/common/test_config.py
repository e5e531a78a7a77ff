"""Settings come from defaults < file < environment < flags, and bad values name the setting."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from ragr1.services.common import config
from ragr1.services.common.server import ServerConfig


@dataclasses.dataclass
class ShardLike(ServerConfig):
    port: int = config.setting(50061, "gRPC port")
    max_batch: int = config.setting(32, "largest micro-batch")
    shards: list[str] = config.setting(list, "shard addresses", factory=True)


def parse(argv: list[str], env: dict[str, str]) -> ShardLike:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, ShardLike)
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ShardLike)}
    return config.load(ShardLike, file=args.config, env=env, overrides=overrides)


def test_precedence(tmp_path: Path) -> None:
    file = tmp_path / "shard.yaml"
    file.write_text("port: 6000\nmax_batch: 8\nhost: 0.0.0.0\n")
    assert parse([], {}).port == 50061
    from_file = parse(["--config", str(file)], {})
    assert (from_file.port, from_file.max_batch, from_file.host) == (6000, 8, "0.0.0.0")
    from_env = parse(["--config", str(file)], {"RAGR1_PORT": "7000", "RAGR1_SHARDS": "a:1, b:2"})
    assert (from_env.port, from_env.max_batch, from_env.shards) == (7000, 8, ["a:1", "b:2"])
    from_flag = parse(["--config", str(file), "--port", "8000"], {"RAGR1_PORT": "7000"})
    assert (from_flag.port, from_flag.max_batch) == (8000, 8)


def test_bad_values_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'max_batch'"):
        parse(["--max-batch", "lots"], {})
    with pytest.raises(ValueError, match="'port'"):
        parse([], {"RAGR1_PORT": "http"})
    file = tmp_path / "bad.yaml"
    file.write_text("prot: 1\n")
    with pytest.raises(ValueError, match=r"unknown settings \['prot'\]"):
        parse(["--config", str(file)], {})


def test_flags_round_trip() -> None:
    cfg = ShardLike(port=1234, shards=["x:1", "y:2"], drain_seconds=0.5)
    again = parse(config.to_flags(cfg), {})
    assert again == cfg


@dataclasses.dataclass
class WithOptionalBool(config.Validated):
    bf16: bool | None = config.setting(None, "unset: the code decides")
    verbose: bool = config.setting(False, "a plain switch")


def test_an_optional_switch_is_on_off_or_unset_from_every_layer(tmp_path: Path) -> None:
    def load(argv: list[str], env: dict[str, str], text: str = "") -> WithOptionalBool:
        parser = argparse.ArgumentParser()
        config.add_arguments(parser, WithOptionalBool)
        file = tmp_path / "c.yaml"
        file.write_text(text)
        overrides = vars(parser.parse_args(argv))
        del overrides["config"]
        return config.load(WithOptionalBool, file=file if text else None, env=env, overrides=overrides)

    assert load([], {}).bf16 is None
    assert load(["--bf16"], {}).bf16 is True and load(["--no-bf16"], {}).bf16 is False
    assert load([], {"RAGR1_BF16": "off"}).bf16 is False and load([], {"RAGR1_BF16": "auto"}).bf16 is None
    assert load([], {}, "bf16: true\n").bf16 is True and load(["--no-bf16"], {}, "bf16: auto\n").bf16 is False
    # "auto" means unset, which a plain switch does not have.
    with pytest.raises(ValueError, match=r"config field 'verbose': not a boolean: 'auto'"):
        load([], {"RAGR1_VERBOSE": "auto"})
    for value in (True, False):
        assert load(config.to_flags(WithOptionalBool(bf16=value)), {}).bf16 is value
    assert config.to_flags(WithOptionalBool()) == ["--no-verbose"]


@dataclasses.dataclass
class Stage(config.Validated):
    lr: float = config.setting(1e-5, "learning rate")
    steps: int = config.setting(10, "steps")
    output_dir: str = config.setting("out", "where it writes")

    def validate(self) -> None:
        super().validate()
        config.check_at_least(self, (("steps", 1),))


@dataclasses.dataclass
class Recipe(config.Validated):
    name: str = config.setting("run", "run name")
    train: Stage = config.section(Stage, "the training stage", managed=("output_dir",))


def parse_recipe(argv: list[str], env: dict[str, str]) -> Recipe:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, Recipe)
    args = parser.parse_args(argv)
    overrides = {n: getattr(args, n) for n, _, _ in config.settings_of(Recipe) if getattr(args, n) is not None}
    return config.load(Recipe, file=args.config, env=env, overrides=overrides)


def test_a_section_s_settings_keep_their_names_in_every_layer(tmp_path: Path) -> None:
    """A section is another command's config: its settings come from a nested mapping in a file,
    ``RAGR1_<SECTION>__<SETTING>`` and ``--<section>.<setting>``, in the usual precedence."""
    file = tmp_path / "recipe.yaml"
    file.write_text("name: small\ntrain:\n  lr: 3.0e-4\n  steps: 5\n")
    assert parse_recipe([], {}).train == Stage()
    from_file = parse_recipe(["--config", str(file)], {})
    assert (from_file.name, from_file.train.lr, from_file.train.steps) == ("small", 3e-4, 5)
    from_env = parse_recipe(["--config", str(file)], {"RAGR1_TRAIN__STEPS": "7"})
    assert (from_env.train.lr, from_env.train.steps) == (3e-4, 7)
    from_flag = parse_recipe(["--config", str(file), "--train.steps", "9"], {"RAGR1_TRAIN__STEPS": "7"})
    assert (from_flag.train.lr, from_flag.train.steps) == (3e-4, 9)
    assert parse_recipe(config.to_flags(from_flag), {}) == from_flag


def test_later_files_override_earlier_ones_section_by_section(tmp_path: Path) -> None:
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text("train:\n  lr: 3.0e-4\n  steps: 5\n")
    top.write_text("train:\n  steps: 2\n")
    loaded = config.load(Recipe, file=[base, top], env={})
    assert (loaded.train.lr, loaded.train.steps) == (3e-4, 2)


def test_a_section_refuses_what_its_class_refuses_naming_the_section(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train: steps must be at least 1, got 0"):
        parse_recipe(["--train.steps", "0"], {})
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text("train:\n  step: 3\n")
    with pytest.raises(ValueError, match=r"unknown settings \['train.step'\]; train.step: did you mean train.steps\?"):
        parse_recipe(["--config", str(misspelt)], {})
    flat = tmp_path / "flat.yaml"
    flat.write_text("train: 3\n")
    with pytest.raises(ValueError, match="train is a section: a mapping of Stage's settings"):
        parse_recipe(["--config", str(flat)], {})


def test_what_the_owner_sets_itself_has_no_flag_and_is_refused_elsewhere(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_recipe(["--train.output-dir", "x"], {})
    with pytest.raises(ValueError, match=r"train.output_dir is not a setting of this command.*RAGR1_TRAIN__OUTPUT_DIR"):
        parse_recipe([], {"RAGR1_TRAIN__OUTPUT_DIR": "x"})
    file = tmp_path / "managed.yaml"
    file.write_text("train:\n  output_dir: x\n")
    with pytest.raises(ValueError, match=r"train\.output_dir is not a setting of this command"):
        parse_recipe(["--config", str(file)], {})
    assert "--train.output-dir" not in config.to_flags(Recipe())
