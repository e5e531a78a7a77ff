"""Configuration for every service, from one mechanism.

Each service's settings are one dataclass whose fields carry their default and help text
(``setting(default, "help")``): that dataclass is the one place a setting is documented.
Values come from, lowest to highest precedence:

1. the field defaults;
2. a YAML or JSON file (``--config FILE``): a mapping of field names to values;
3. environment variables ``RAGR1_<FIELD>`` (upper case, e.g. ``RAGR1_PORT=50051``);
4. command-line flags ``--<field-name>`` (dashes for underscores, e.g. ``--metrics-port 9100``).

A field may be a *section*: another config dataclass whose settings a command passes on to a command it
runs (``ragr1 demo``'s ``ppo`` is the ``PPOConfig`` of its ``ragr1 train ppo``). Its settings keep their own
names under the section's: ``--ppo.actor-lr``, ``RAGR1_PPO__ACTOR_LR``, ``ppo: {actor_lr: ...}`` in a file,
and the section's class checks them as it checks its own command's flags.

``ragr1 serve <service> --help`` lists every field with its default and environment variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import os
import sys
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from ragr1.protocol.information import TOKENS_PER_QUERY, TOP_K

ENV_PREFIX = "RAGR1_"

T = TypeVar("T")


def setting(default: Any, help: str, *, factory: bool = False, group: str = "") -> Any:
    """A config field with its documentation. ``factory`` for mutable defaults (lists); ``group``: the
    help group it is listed under (one of ``HELP_GROUPS``) where its class's own group is not it."""
    metadata = {"help": help, **({"group": group} if group else {})}
    if factory:
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, help: str, *, managed: Sequence[str] = ()) -> Any:
    """A nested config of type ``cls``, defaulting to ``cls()``. ``managed``: fields of ``cls`` the owning
    command sets itself (where its services listen, its own files): they get no flag, and a file or
    variable that sets one is refused."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(managed) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {unknown}")
    return dataclasses.field(default_factory=cls, metadata={"help": help, "section": cls, "managed": tuple(managed)})


def same_as(cls: type, name: str) -> Any:
    """The setting ``name`` of ``cls``, its default and help, for a command that passes it on to ``cls``'s
    command under the same name (``ragr1 up --max-turns`` is the policy's ``max_turns``)."""
    home = home_of(cls, name)
    (f,) = [f for f in dataclasses.fields(home) if f.name == name]
    metadata = {**f.metadata, "home": home}
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=metadata)
    return dataclasses.field(default=f.default, metadata=metadata)


def part_of(cls: type[T], config: object, fields_of: type | None = None) -> T:
    """A ``cls`` made of ``config``'s values of ``fields_of``'s fields (``cls``'s by default), for a config
    that is a ``fields_of`` among others: the policy's config is its default sampling, too."""
    names = [f.name for f in dataclasses.fields(fields_of or cls)]
    return cls(**{name: getattr(config, name) for name in names})


def home_of(cls: type, name: str) -> type:
    """The class whose field definition gives ``cls``'s setting ``name`` its default and help."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            (f,) = [f for f in dataclasses.fields(klass) if f.name == name]
            home: type = f.metadata.get("home", klass)
            return home
    raise TypeError(f"{cls.__name__} has no setting {name!r}")


def section_of(f: dataclasses.Field[Any]) -> type | None:
    """The config class of a section field, or None for a plain setting."""
    cls: type | None = f.metadata.get("section")
    return cls


def managed_of(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    return tuple(f.metadata.get("managed", ()))


def settings_of(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """Every setting of ``cls`` a user may set, sections flattened: (dotted name, field, type hint)."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        sub = section_of(f)
        if sub is None:
            yield prefix + f.name, f, hints[f.name]
            continue
        managed = set(managed_of(f))
        yield from ((n, g, h) for n, g, h in settings_of(sub, f"{prefix}{f.name}.")
                    if n.removeprefix(f"{prefix}{f.name}.") not in managed)


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


def check_required(config: object, fields: Sequence[tuple[str, str]]) -> None:
    """Raises ValueError naming the first empty field of ``config`` and what it is for."""
    for name, what in fields:
        if not getattr(config, name):
            raise ValueError(f"{name} is required: {what}")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


# ``--help`` lists a command's own settings first, then these groups in this order; ``--help GROUP`` one
# of them. A config class says its group as ``help_group``; a setting as ``setting(..., group=)``.
HELP_GROUPS = {
    "model": "the model and its engine",
    "information": "the <information> block",
    "redis": "Redis: the prompts and rollouts streams",
    "tls": "TLS of the server",
    "server": "the server: address, metrics, shutdown, auth, logging",
}
OWN_GROUP = "command"


def help_group(cls: type, name: str, f: dataclasses.Field[Any]) -> str:
    """The help group of ``cls``'s setting ``name``: the setting's own, else its defining class's, else the
    command's own settings (``OWN_GROUP``)."""
    if f.metadata.get("group"):
        return str(f.metadata["group"])
    home = home_of(cls, name)
    group = getattr(home, "help_group", None)
    return str(group) if group and home is not cls else OWN_GROUP


@dataclasses.dataclass
class InformationSettings(Validated):
    """The <information> block RAG-R1 inserts after a search: the policy's loop builds it, and SFT
    trajectories (``ragr1 train sft``, ``ragr1 data prepare``) must show the same one, so SFT teaches what
    RL sees."""

    help_group: ClassVar[str] = "information"

    top_k: int = setting(TOP_K, "passages per query in the <information> block (SFT's and the policy's agree)")
    tokens_per_query: int = setting(
        TOKENS_PER_QUERY,
        "tokens of documents per query in the <information> block (RAG-R1: 1000; SFT's and the policy's agree)",
    )

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("top_k", 1), ("tokens_per_query", 1)))


@dataclasses.dataclass
class ServerTLS(Validated):
    """A server's TLS settings, the same for every gRPC server and ``ragr1 redis``."""

    help_group: ClassVar[str] = "tls"

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


@dataclasses.dataclass
class Listening(ServerTLS):
    """Where a server listens, the same for every gRPC server and ``ragr1 redis``."""

    help_group: ClassVar[str] = "server"

    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0 in containers)")

    def validate(self) -> None:
        super().validate()
        # Each server declares its own port (and metrics_port, -1 meaning "derived"): refused here, by
        # name, instead of as bind()'s OverflowError once the server starts.
        for name, low in (("port", 0), ("metrics_port", -1)):
            value = getattr(self, name, None)
            if isinstance(value, int) and not low <= value <= 65535:
                raise ValueError(f"{name} must be within [{low}, 65535], got {value}")


def write_secret(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path`` readable by its owner only (mode 0600 from creation on)."""
    path.touch(mode=0o600)
    path.chmod(0o600)  # an existing file keeps its mode through touch
    path.write_text(text)
    return path


def env_name(field_name: str) -> str:
    """``RAGR1_<FIELD>``; a section's setting ``ppo.actor_lr`` is ``RAGR1_PPO__ACTOR_LR``."""
    return ENV_PREFIX + field_name.upper().replace(".", "__")


def flag_name(field_name: str) -> str:
    """``--<field>`` with dashes for underscores; a section's setting ``ppo.actor_lr`` is ``--ppo.actor-lr``."""
    return "--" + field_name.replace("_", "-")


def base_type(tp: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` stays as is."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return base_type(args[0])
    return tp


def _convert(name: str, tp: Any, value: Any, source: str = "") -> Any:
    """Converts a file, environment or flag value to the field's type, naming the field and where the
    value came from (``RAGR1_PORT``, ``--port``) on error."""
    base = base_type(tp)
    if value is None:
        return None
    try:
        if typing.get_origin(base) is list:
            (item,) = typing.get_args(base)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            return [_convert(name, item, v, source) for v in value]
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
        where = f" (from {source})" if source else ""
        raise ValueError(f"config field {name!r}: {exc}{where}") from exc
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def read_file(path: Path) -> dict[str, Any]:
    text = Path(path).read_text()
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:  # their messages name a line, never the file
        raise ValueError(f"config file {path}: not valid {'JSON' if str(path).endswith('.json') else 'YAML'}: "
                         f"{' '.join(str(exc).split())}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path}: expected a mapping of setting names to values")
    return data


def _check_keys(cls: type, data: Mapping[str, Any], where: str, prefix: str = "") -> None:
    """Refuses a key of a file that is no setting of ``cls`` (sections checked against their own class)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(prefix + k for k in set(data) - set(fields))
    if unknown:
        known = sorted(prefix + k for k in fields)
        close = {u: m[0] for u in unknown if (m := difflib.get_close_matches(u, known, n=1))}
        hint = "".join(f"; {u}: did you mean {m}?" for u, m in close.items())
        raise ValueError(f"{where}: unknown settings {unknown}{hint}; known: {known}")
    for key, value in data.items():
        sub = section_of(fields[key])
        if sub is None:
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: {prefix}{key} is a section: a mapping of {sub.__name__}'s settings")
        _check_keys(sub, value, where, f"{prefix}{key}.")


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, section by section."""
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if both else value
    return out


def _build(
    cls: type[T], data: Mapping[str, Any], env: Mapping[str, str], overrides: Mapping[str, Any], prefix: str = "",
    managed: Sequence[str] = (),
) -> T:
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = prefix + f.name
        sub = section_of(f)
        if sub is not None:
            values[f.name] = _build(sub, data.get(f.name) or {}, env, overrides, name + ".", managed_of(f))
            continue
        given = []
        if f.name in data:
            given.append(f"a config file's {name}")
            values[f.name] = _convert(name, hints[f.name], data[f.name], "config file")
        if env_name(name) in env:
            given.append(env_name(name))
            values[f.name] = _convert(name, hints[f.name], env[env_name(name)], env_name(name))
        if overrides.get(name) is not None:
            given.append(flag_name(name))
            values[f.name] = _convert(name, hints[f.name], overrides[name], flag_name(name))
        if given and f.name in managed:
            raise ValueError(f"{name} is not a setting of this command: it sets it itself ({', '.join(given)})")
    try:
        return cls(**values)
    except ValueError as exc:
        if prefix:  # which section the refused setting belongs to
            raise ValueError(f"{prefix[:-1]}: {exc}") from exc
        raise


def load(
    cls: type[T],
    *,
    file: Path | Sequence[Path] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Builds ``cls`` from defaults < file(s), later over earlier < environment < ``overrides`` (flags
    already parsed, keyed by dotted name)."""
    files = [] if file is None else [file] if isinstance(file, str | Path) else list(file)
    data: dict[str, Any] = {}
    for path in files:
        text = read_file(path)
        _check_keys(cls, text, f"config file {path}")
        data = _merge(data, text)
    names = {name for name, _, _ in settings_of(cls)}
    for key in overrides or {}:
        if key not in names:
            raise ValueError(f"unknown setting {key!r}; known: {sorted(names)}")
    return _build(cls, data, os.environ if env is None else env, overrides or {})


def help_groups(cls: type) -> dict[str, list[tuple[str, dataclasses.Field[Any], Any]]]:
    """``cls``'s settings by help group, in the order ``--help`` lists them: the command's own, each
    section (named for it), then ``HELP_GROUPS``."""
    groups: dict[str, list[tuple[str, dataclasses.Field[Any], Any]]] = {OWN_GROUP: []}
    own = {f.name for f in dataclasses.fields(cls)}
    for name, f, hint in settings_of(cls):
        top = name.split(".")[0]
        key = top if "." in name else help_group(cls, name, f) if top in own else OWN_GROUP
        groups.setdefault(key, []).append((name, f, hint))
    order = [OWN_GROUP, *(k for k in groups if k not in HELP_GROUPS and k != OWN_GROUP), *HELP_GROUPS]
    return {k: groups[k] for k in order if groups.get(k)}


class _HelpAction(argparse.Action):
    """``--help``: every group; ``--help GROUP``: that group's settings alone."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None:
            parser.print_help()
            parser.exit()
        titles = {g.title: g for g in parser._action_groups}
        group = titles.get(values) or next((g for t, g in titles.items() if t and t.startswith(f"{values}:")), None)
        if group is None:
            keys = [t.split(":")[0] for t in titles if t and ":" in t]
            parser.error(f"--help {values}: no such group; groups: {', '.join(keys)}")
        formatter = parser._get_formatter()
        formatter.start_section(group.title)
        formatter.add_arguments(group._group_actions)
        formatter.end_section()
        parser._print_message(formatter.format_help(), sys.stdout)  # as --help prints
        parser.exit()


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--flag`` per setting (sections' as ``--<section>.<setting>``), in help groups (see
    ``help_groups``); absent flags stay ``None`` so that lower layers show through. A parser made with
    ``add_help=False`` gets ``-h/--help [GROUP]``, which shows one group."""
    grouped = help_groups(cls)
    if not parser.add_help:
        parser.add_argument("-h", "--help", nargs="?", metavar="GROUP", action=_HelpAction, default=None,
                            help=f"show this help, or one group's: {', '.join(grouped)}")
    parser.add_argument("--config", type=Path, default=None, help="YAML or JSON file of settings")
    for key, members in grouped.items():
        title = HELP_GROUPS.get(key, "this command's own settings" if key == OWN_GROUP else f"section {key}")
        group = parser.add_argument_group(f"{key}: {title}")
        for name, f, hint in members:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            help_text = f"{f.metadata.get('help', '')} [default: {default!r}; env {env_name(name)}]"
            if base_type(hint) is bool:
                group.add_argument(flag_name(name), dest=name, default=None,
                                   action=argparse.BooleanOptionalAction, help=help_text)
            else:
                group.add_argument(flag_name(name), dest=name, default=None, help=help_text)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    overrides = {n: getattr(args, n) for n, _, _ in settings_of(cls) if getattr(args, n, None) is not None}
    return load(cls, file=getattr(args, "config", None), overrides=overrides)


def flags(cls: type, settings: Mapping[str, Any]) -> list[str]:
    """The command-line flags that set ``settings`` on a command configured by ``cls``. A ``cls`` is made
    from them first, so that a setting it does not have, or a bad value, fails here, in the process that
    writes the command line, instead of at the child's start."""
    return to_flags(cls(**settings), names=list(settings))


def to_flags(config: Any, names: Sequence[str] | None = None, prefix: str = "") -> list[str]:
    """The flags that reproduce ``config`` (or some of its fields) on another process's command line."""
    out: list[str] = []
    for f in dataclasses.fields(config):
        if names is not None and f.name not in names:
            continue
        value = getattr(config, f.name)
        if section_of(f) is not None:
            managed = set(managed_of(f))
            own = [g.name for g in dataclasses.fields(value) if g.name not in managed]
            out += to_flags(value, own, prefix=f"{prefix}{f.name}.")
            continue
        if value is None:
            continue
        flag = flag_name(prefix + f.name)
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, list):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out
