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
