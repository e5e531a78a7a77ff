"""docker-compose files as docker-compose itself resolves them."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.deploy.conftest import ROOT, tool


def config(*files: str) -> dict[str, Any]:
    """The files as docker-compose itself resolves them (anchors, merges, defaults)."""
    args = [tool("docker-compose"), "--project-directory", str(ROOT)]
    for name in files:
        args += ["-f", str(ROOT / name)]
    result = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)
