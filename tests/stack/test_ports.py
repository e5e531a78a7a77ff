"""Bad settings (a port in use, an unknown reward) stop `ragr1 demo` before it indexes or starts anything."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ragr1.services.common.redis_server import free_port


def test_a_port_in_use_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    base = free_port() // 100 * 100
    with socket.socket() as held:
        # Redis's port in a --base-port layout, the first the demo checks: whatever else on the machine holds another
        # port of the block, this is the one the error names.
        held.bind(("127.0.0.1", base))
        held.listen()
        result = subprocess.run(
            [sys.executable, "-m", "ragr1", "demo", "--preset", "quick", "--base-port", str(base), "--run-dir",
             str(tmp_path / "run")],
            capture_output=True, text=True, timeout=300,
        )
    assert result.returncode == 1
    assert f"port {base} (redis) is already in use" in result.stderr
    assert "--base-port" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reward", "bleu"], "reward must be one of em, f1, parallel-search, got 'bleu'"),
        (["--rl-questions", "0"], "rl_questions must be at least 1"),
        (["--ppo.mode", "none"], "ppo.mode must be one of single, multi, got 'none'"),
        (["--ppo.samples-per-prompt", "3"], "ppo: batch_size (8) must be a multiple of samples_per_prompt (3)"),
    ],
)
def test_bad_rl_settings_stop_the_demo_before_anything_starts(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ragr1", "demo", "--preset", "long", *flags, "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert f"ragr1 demo: error: {message}" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before a run folder was made
