"""Which code produced a result: the git commit of this checkout, for reports and ``Policy.Info``."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
UNKNOWN = "unknown"


def code_commit(root: Path = ROOT) -> str:
    """The commit checked out at ``root``, with "-dirty" when tracked files differ from it; "unknown" when
    ``root`` is not a git checkout (an installed package, a container image) or git is missing. Only a
    checkout rooted at ``root`` counts: a package installed inside another project's tree is not that
    project's code."""
    if not (root / ".git").exists():  # a directory in a clone, a file in a worktree
        return UNKNOWN
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return UNKNOWN
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    return head.stdout.strip() + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")
