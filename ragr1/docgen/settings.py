"""``docs/reference/settings.md``: every ``ragr1`` command's settings, read from the parser ``ragr1`` builds.

Each command's parser keeps the config dataclass it was built from (``config_class``, see
``ragr1.services.common.commands.command``); a setting's default and help come from that dataclass's field,
its flag and environment variable from the one rule in ``ragr1.services.common.config``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragr1.docgen.markdown import HEADER, ROOT, cell, code, slug, table
from ragr1.services.common.config import (
    HELP_GROUPS,
    OWN_GROUP,
    base_type,
    env_name,
    flag_name,
    help_groups,
    managed_of,
    section_of,
    settings_of,
)

# Flags every command has that are not settings.
_NOT_SETTINGS = {"help", "config"}


@dataclasses.dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # ("serve", "reward")
    help: str
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return "ragr1 " + " ".join(self.words)

    @property
    def config_class(self) -> type:
        cls: type = self.parser.get_default("config_class")
        return cls

    @property
    def fixed(self) -> dict[str, Any]:
        return dict(self.parser.get_default("fixed_settings") or {})


def commands(parser: argparse.ArgumentParser | None = None, words: tuple[str, ...] = (),
             help: str = "") -> Iterator[Command]:
    """Every command of ``ragr1`` that runs with a config dataclass, in the order ``ragr1 --help`` lists them."""
    if parser is None:
        from ragr1.cli import build_parser

        parser = build_parser()
    if parser.get_default("config_class") is not None:
        yield Command(words, help, parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield from commands(sub, (*words, name), helps.get(name, ""))


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def show(value: Any) -> str:
    """A default as a user would write it in a YAML config file."""
    if isinstance(value, str | bool | int | float | list) or value is None:
        return json.dumps(value)
    return str(value)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is not None and origin is not list:  # X | None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return type_name(args[0]) + " or null"
    if origin is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def flag_of(name: str, tp: Any) -> str:
    flag = flag_name(name)
    return f"{flag}, --no-{flag.removeprefix('--')}" if base_type(tp) is bool else flag


def source_of(cls: type) -> str:
    return Path(inspect.getsourcefile(cls) or "").resolve().relative_to(ROOT).as_posix()


def section_text(name: str, f: dataclasses.Field[Any], sub: type, found: list[Command]) -> str:
    """A section: where its settings are listed (the command it configures), and which the owner sets."""
    home = next((c for c in found if issubclass(c.config_class, sub)), None)
    where = f"[{home.name}](#{slug(home.name)})" if home else f"`{sub.__name__}`"
    managed = managed_of(f)
    text = (f"Section `{name}` ({cell(f.metadata.get('help', ''))}): the settings of {where}, each under "
            f"`{name}.`: {code(flag_name(name) + '.<setting>')}, {code(env_name(name) + '__<SETTING>')}")
    if managed:
        text += "; set by this command itself: " + ", ".join(managed)
    return text + ".\n"


def setting_cell(name: str, tp: Any) -> str:
    """The name (a user writes it in a file), and the flag only where the rule alone would not give it."""
    extra = f" (`--no-{flag_name(name).removeprefix('--')}`)" if base_type(tp) is bool else ""
    return code(name) + extra


def settings_table(cls: type, found: list[Command]) -> str:
    """One table per help group, in ``--help``'s order, three columns wide: a setting's flag and variable
    follow from its name by the rule above the tables, so that the name, the default and the help have
    the page's width."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    parts = []
    for key, members in help_groups(cls).items():
        if key in fields and section_of(fields[key]) is not None:
            parts.append(section_text(key, fields[key], section_of(fields[key]), found))  # type: ignore[arg-type]
            continue
        title = HELP_GROUPS.get(key, "this command's own settings" if key == OWN_GROUP else key)
        rows = [[setting_cell(name, hint), f"{type_name(hint)}, {code(show(default_of(f)))}",
                 cell(f.metadata.get("help", ""))] for name, f, hint in members]
        parts.append(f"**{key}**: {cell(title)} (`--help {key}`)\n\n"
                     + table(["Setting", "Type, default", "What it sets"], rows))
    return "\n".join(parts)


def other_flags(command: Command) -> list[str]:
    """Flags of ``command`` that are not settings of its config class (``ragr1 demo --preset``)."""
    names = {name for name, _, _ in settings_of(command.config_class)} | _NOT_SETTINGS
    out = []
    for action in command.parser._actions:
        if action.dest not in names and action.option_strings:
            out.append(f"`{', '.join(action.option_strings)}`: {cell(action.help or '')}")
    return out


def render() -> str:
    found = list(commands())
    intro = f"""# Settings of every command

Every `ragr1` command is configured by one dataclass, whose fields carry each setting's default and help.
A setting's value comes from, lowest to highest precedence:

1. its default;
2. a YAML or JSON file given with `--config FILE`: a mapping of setting names to values;
3. the environment variable `RAGR1_<SETTING>` (upper case, e.g. `RAGR1_PORT=50051`);
4. its flag `--<setting>` (dashes for underscores, e.g. `--metrics-port 9100`; `--no-<setting>` turns a
   boolean off).

So the tables below name each setting once, as a file writes it: `metrics_port` is `--metrics-port` and
`RAGR1_METRICS_PORT`. They group a command's settings as its `--help` does (its own first, then the model,
Redis, TLS, the server), and `ragr1 <command> --help GROUP` prints one group.

Lists are comma-separated in flags and the environment (`--benchmarks nq,popqa`), YAML lists in a file.
A *section* holds the settings of another command that this one runs, under that command's names:
`ragr1 demo --ppo.actor-lr 1e-5`, `RAGR1_PPO__ACTOR_LR`, or `ppo: {{actor_lr: 1e-5}}` in a file.
A bad value is refused before anything starts, naming the setting. `ragr1 <command> --help` prints the same
settings for one command.

Commands: {", ".join(f"[{c.name}](#{slug(c.name)})" for c in found)}.
"""
    parts = [HEADER.format(source="the config dataclasses of every command"), intro]
    first_of: dict[type, Command] = {}
    for command in found:
        cls = command.config_class
        parts.append(f"\n## {command.name}\n\n{cell(command.help[:1].upper() + command.help[1:])}.\n\n")
        fixed = ", ".join(f"`{k}` is always {code(show(v))}" for k, v in command.fixed.items())
        if cls in first_of:
            same = first_of[cls]
            parts.append(f"The settings of [{same.name}](#{slug(same.name)})" + (f"; {fixed}.\n" if fixed else ".\n"))
            continue
        first_of[cls] = command
        parts.append(f"Settings: `{cls.__name__}` in `{source_of(cls)}`." + (f" Here {fixed}." if fixed else "")
                     + "\n\n")
        parts.append(settings_table(cls, found))
        others = other_flags(command)
        if others:
            parts.append("\nOther flags: " + "; ".join(others) + "\n")
    return "".join(parts)
