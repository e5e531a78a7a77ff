"""Configuration for every service, from one mechanism.

Each service's settings are one dataclass whose fields carry their default and help text
(``setting(default, "help")``): that dataclass is the one place a setting is documented.
Values come from, lowest to highest precedence:

1. the field defaults;
2. a YAML or JSON file (``--config FILE``): a mapping of field names to values;
3. environment variables ``RAGR1_<FIELD>`` (upper case, e.g. ``RAGR1_PORT=50051``);
4. command-line flags ``--<field-name>`` (dashes for underscores, e.g. ``--metrics-port 9100``).

``ragr1 serve <service> --help`` lists every field with its default and environment variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

ENV_PREFIX = "RAGR1_"

T = TypeVar("T")


def setting(default: Any, help: str, *, factory: bool = False) -> Any:
    """A config field with its documentation. ``factory`` for mutable defaults (lists)."""
    if factory:
        return dataclasses.field(default_factory=default, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


class Validated:
    """A config dataclass that checks itself whenever one is made (from defaults, a file, the environment,
    flags or ``dataclasses.replace``): a bad value is refused, naming the setting, before anything is built.
    Subclasses extend ``validate`` and call ``super().validate()``."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first setting out of range."""


def check_at_least(config: object, bounds: Sequence[tuple[str, int]]) -> None:
    """Raises ValueError naming the first field of ``config`` below its bound (a None field is unset)."""
    for name, low in bounds:
        value = getattr(config, name)
        if value is not None and value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


@dataclasses.dataclass
class ServerTLS(Validated):
    """A server's TLS settings, the same for every gRPC server and ``ragr1 redis``."""

    tls_cert_file: str = setting("", "PEM server certificate; with tls_key_file turns TLS on")
    tls_key_file: str = setting("", "PEM private key of tls_cert_file")
    tls_client_ca_file: str = setting("", "PEM CA of client certificates; set it to require them (mTLS)")

    def validate(self) -> None:
        super().validate()
        if not (self.tls_cert_file or self.tls_key_file):
            if self.tls_client_ca_file:
                raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file too")
        elif not (self.tls_cert_file and self.tls_key_file):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file")


def write_secret(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path`` readable by its owner only (mode 0600 from creation on)."""
    path.touch(mode=0o600)
    path.chmod(0o600)  # an existing file keeps its mode through touch
    path.write_text(text)
    return path


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def base_type(tp: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` stays as is."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return base_type(args[0])
    return tp


def _convert(name: str, tp: Any, value: Any) -> Any:
    """Converts a file, environment or flag value to the field's type, naming the field on error."""
    base = base_type(tp)
    if value is None:
        return None
    try:
        if typing.get_origin(base) is list:
            (item,) = typing.get_args(base)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            return [_convert(name, item, v) for v in value]
        if base is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            if text == "auto" and base is not tp:  # an optional bool: unset, the code decides
                return None
            raise ValueError(f"not a boolean: {value!r}")
        if base is Path:
            return Path(value)
        if base in (int, float, str):
            return base(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config field {name!r}: {exc}") from exc
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def read_file(path: Path) -> dict[str, Any]:
    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path}: expected a mapping of setting names to values")
    return data


def load(
    cls: type[T],
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Builds ``cls`` from defaults < file < environment < ``overrides`` (flags already parsed)."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    if file is not None:
        data = read_file(file)
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"config file {file}: unknown settings {unknown}; known: {sorted(names)}")
        for key, raw in data.items():
            values[key] = _convert(key, hints[key], raw)
    env = os.environ if env is None else env
    for name in names:
        if env_name(name) in env:
            values[name] = _convert(name, hints[name], env[env_name(name)])
    for key, raw in (overrides or {}).items():
        if key not in names:
            raise ValueError(f"unknown setting {key!r}; known: {sorted(names)}")
        if raw is not None:
            values[key] = _convert(key, hints[key], raw)
    return cls(**values)


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--flag`` per field; absent flags stay ``None`` so that lower layers show through."""
    hints = _hints(cls)
    parser.add_argument("--config", type=Path, default=None, help="YAML or JSON file of settings")
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        help_text = f"{f.metadata.get('help', '')} [default: {default!r}; env {env_name(f.name)}]"
        flag = "--" + f.name.replace("_", "-")
        if base_type(hints[f.name]) is bool:
            parser.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    overrides = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return load(cls, file=getattr(args, "config", None), overrides=overrides)


def flags(cls: type, settings: Mapping[str, Any]) -> list[str]:
    """The command-line flags that set ``settings`` on a command configured by ``cls``. A ``cls`` is made
    from them first, so that a setting it does not have, or a bad value, fails here, in the process that
    writes the command line, instead of at the child's start."""
    return to_flags(cls(**settings), names=list(settings))


def to_flags(config: Any, names: Sequence[str] | None = None) -> list[str]:
    """The flags that reproduce ``config`` (or some of its fields) on another process's command line."""
    out: list[str] = []
    for f in dataclasses.fields(config):
        if names is not None and f.name not in names:
            continue
        value = getattr(config, f.name)
        if value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out
