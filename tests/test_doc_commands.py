"""Every ``ragr1 ...`` command line the README and the docs show exists: its subcommands are the real
parser's, and every flag it passes is one that command takes. Checked against the parser ``ragr1`` itself
builds (no process is started). Command lines are taken from code: fenced blocks and inline code spans."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ragr1.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
# `ragr1` as a command (not `ragr1.cli`, not `ragr1/`), then its words and flags up to the end of the command.
COMMAND = re.compile(r"(?:^|[\s/(])ragr1((?: +\S+)*)")
# `ragr1 serve <name>` (`retriever`, `policy`, ...): the names a placeholder stands for, listed after it.
CHOICES = re.compile(r"`ragr1 ([a-z][\w -]*) <\w+>`\s*\(((?:`[\w-]+`,?\s*)+)\)")
STOP = re.compile(r"[|;&)#]|&&|\\$")


def code_of(text: str) -> list[str]:
    fenced = [line for block in FENCE.findall(text) for line in block.splitlines()]
    inline = SPAN.findall(FENCE.sub("", text))
    return fenced + inline


def command_lines() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for code in code_of(page.read_text()):
            for match in COMMAND.finditer(code):
                words = STOP.split(match.group(1))[0].split()
                if words:
                    found.append((str(page.relative_to(ROOT)), " ".join(words)))
        for match in CHOICES.finditer(" ".join(page.read_text().split())):
            for name in re.findall(r"`([\w-]+)`", match.group(2)):
                found.append((str(page.relative_to(ROOT)), f"{match.group(1)} {name}"))
    return sorted(set(found))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


PARSER = build_parser()
LINES = command_lines()


def test_the_pages_show_commands() -> None:
    """The extraction finds what it must (an empty list would pass everything below)."""
    shown = {line for _, line in LINES}
    assert {"serve retriever-shard --index idx/flat2 --shard 0 --port 50061", "demo", "serve reward"} <= shown


@pytest.mark.parametrize(("page", "line"), LINES, ids=[f"{p}: ragr1 {line}" for p, line in LINES])
def test_every_ragr1_command_line_in_the_docs_exists(page: str, line: str) -> None:
    parser, path = PARSER, ["ragr1"]
    words = line.split()
    while words and (choices := subcommands(parser)):
        word = words[0]
        if word.startswith("-") or not re.fullmatch(r"[a-z][\w-]*", word):
            break  # `ragr1 --version`, `ragr1 serve <name>`: a flag or a placeholder, checked below
        assert word in choices, f"{page}: `{' '.join(path)} {word}` does not exist; there are {sorted(choices)}"
        parser, path, words = choices[word], [*path, word], words[1:]
    known = flags_of(parser)
    for word in words:
        flag = word.split("=")[0]
        if flag.startswith("--") and not flag.startswith("--no-"):
            assert flag in known, f"{page}: `{' '.join(path)}` has no flag {flag}"
