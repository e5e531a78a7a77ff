"""What the benchmarks share: the checkout they run from, and the header line each prints so that a figure can be
traced to the code and the machine that gave it.

A benchmark runs as a script (``python bench/<subject>/<name>.py``), so Python puts its own folder, not the
checkout, on the path; each puts the checkout there itself before it imports ``bench`` or ``ragr1``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit, or "unknown" outside a git checkout."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def header() -> str:
    """The commit, the time, the cores and the load: what a results page records beside a figure."""
    return (f"commit {commit()}, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}")
