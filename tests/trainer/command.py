"""``ragr1 train ppo`` as the deployments start it, in a child process that imports this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train_ppo(*flags: str) -> list[str]:
    return [sys.executable, "-m", "ragr1", "train", "ppo", *flags]


def child_env() -> dict[str, str]:
    # The child runs from the checkout with it first on the import path: an installed ragr1 would
    # otherwise be the one tested.
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run_train_ppo(*flags: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Runs it to the end, its output captured."""
    return subprocess.run(train_ppo(*flags), env=child_env(), cwd=ROOT, capture_output=True, timeout=timeout)
