"""The code stays clean for ruff and mypy (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.common import background_mypy

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=background_mypy.ROOT, capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    result = run(str(BIN / "ruff"), "check", "ragr1", "tests", "bench", "deploy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    # In a multi-worker run the controller started this same command at the lowest priority (tests/conftest.py).
    background = background_mypy.result()
    if background is None:
        result = run(str(background_mypy.MYPY))
        background = (result.returncode, result.stdout + result.stderr)
    assert background[0] == 0, background[1]
