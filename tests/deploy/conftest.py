"""Paths and loaders shared by the deploy tests."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import helm_python
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ragr1"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    """The chart, loaded by Helm's own library."""
    loaded = helm_python.Chart.load(CHART)
    yield loaded
    loaded.close()


def load_dashboard_generator() -> ModuleType:
    """``deploy/grafana/generate.py`` (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("ragr1_dashboards", ROOT / "deploy" / "grafana" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def tool(name: str) -> str:
    """A command-line tool the deploy tests need; scripts/install.sh installs it (Debian package)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/install.sh as root (it installs prometheus and docker-compose)")
    return path


# `ragr1 <args>` inside a shell line, possibly after `exec` or variable assignments.
_RAGR1_LINE = re.compile(r"(?:^|[\s;&|])(?:exec\s+)?ragr1\s+(.*)$")


def ragr1_invocations(argv: list[str]) -> list[list[str]]:
    """The ``ragr1`` command lines a container runs: its argv directly, or each ``ragr1`` line of an
    ``sh -c`` script (with ``"$@"`` standing for the arguments after the script's ``$0``, or for none
    when the script sets them itself; docker-compose writes it ``$$@``)."""
    if argv[0] == "ragr1":
        return [argv[1:]]
    if argv[:2] == ["sh", "-c"]:
        extra = argv[4:]
        out = []
        for line in argv[2].splitlines():
            match = _RAGR1_LINE.search(line)
            if match:
                words = shlex.split(match.group(1))
                out.append([w for word in words for w in (extra if word in ("$@", "$$@") else [word])])
        return out
    return []
