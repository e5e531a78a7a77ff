"""``--help`` of every command lists its settings by concern (the command's own first, then sections, the
model, the <information> block, Redis, TLS, the server), and ``--help GROUP`` shows one group alone."""

from __future__ import annotations

import argparse
import re

import pytest

from ragr1.cli import build_parser
from ragr1.services.common.config import HELP_GROUPS, OWN_GROUP


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command parser under ``parser`` (those with settings: made by ``commands.command``)."""
    out: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if hasattr(sub, "_defaults") and "config_class" in sub._defaults:
                    out[sub.prog] = sub
                out.update(commands(sub))
    return out


def help_of(parser: argparse.ArgumentParser, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(list(args))
    assert exit_.value.code == 0
    return capsys.readouterr().out


def flags_under(text: str) -> list[str]:
    return re.findall(r"^  (--[\w.-]+)", text, flags=re.MULTILINE)


PARSERS = commands(build_parser())


def test_policy_help_lists_its_own_settings_first_then_model_information_redis_tls_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(PARSERS["ragr1 serve policy"], "--help", capsys=capsys)
    titles = re.findall(r"^(\w+): .*:$", text, flags=re.MULTILINE)
    assert titles == [OWN_GROUP, "model", "information", "redis", "tls", "server"]
    sections = dict(zip(titles, re.split(r"^\w+: .*:$", text, flags=re.MULTILINE)[1:], strict=True))
    assert "--max-turns" in flags_under(sections[OWN_GROUP])
    assert "--model" in flags_under(sections["model"]) and "--dtype" in flags_under(sections["model"])
    assert flags_under(sections["redis"])[0] == "--redis-url"
    assert flags_under(sections["tls"]) == ["--tls-cert-file", "--tls-key-file", "--tls-client-ca-file"]
    assert {"--host", "--metrics-port", "--log-level"} <= set(flags_under(sections["server"]))


@pytest.mark.parametrize("spelling", [["--help", "redis"], ["--help=redis"], ["-h", "redis"]])
def test_help_group_shows_that_group_alone(capsys: pytest.CaptureFixture[str], spelling: list[str]) -> None:
    text = help_of(PARSERS["ragr1 serve policy"], *spelling, capsys=capsys)
    flags = flags_under(text)
    # The queue's settings: Redis's, and the rollout workers' consumer group on its prompts stream.
    assert flags and all(f.startswith("--redis-") or f == "--worker-group" for f in flags), text


def test_an_unknown_group_is_one_line_naming_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        PARSERS["ragr1 serve policy"].parse_args(["--help", "redis-url"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--help redis-url: no such group; groups: command, model, information, redis, tls, server" in line


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_command_has_grouped_help_and_every_group_shows_alone(prog: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    parser = PARSERS[prog]
    text = help_of(parser, "--help", capsys=capsys)
    titles = re.findall(r"^([\w-]+): .*:$", text, flags=re.MULTILINE)
    common = [t for t in titles if t in HELP_GROUPS]  # after the command's own and its sections, in order
    assert titles and titles[len(titles) - len(common):] == common == [g for g in HELP_GROUPS if g in common]
    assert OWN_GROUP not in titles or titles[0] == OWN_GROUP
    shown = []
    for title in titles:
        shown += flags_under(help_of(parser, "--help", title, capsys=capsys))
    # Flags a command adds itself (``ragr1 demo --preset``) stay under argparse's "options".
    grouped = text[text.index(f"\n{titles[0]}: "):]
    assert sorted(shown) == sorted(flags_under(grouped)), prog
