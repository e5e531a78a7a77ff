"""Bad settings (a port in use, an unknown reward) stop `ragr1 demo` before it indexes or starts anything."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from ragr1.services.common.redis_server import free_port


def test_a_port_in_use_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    base = free_port() // 100 * 100
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 5))  # the trainer's port in a --base-port layout
        held.listen()
        result = subprocess.run(
            [sys.executable, "-m", "ragr1", "demo", "--preset", "quick", "--base-port", str(base), "--run-dir",
             str(tmp_path / "run")],
            capture_output=True, text=True, timeout=300,
        )
    assert result.returncode == 1
    assert f"port {base + 5} (trainer) is already in use" in result.stderr
    assert "--base-port" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_an_unknown_reward_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ragr1", "demo", "--preset", "long", "--reward", "bleu", "--run-dir",
         str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert "--reward must be one of em, f1, got 'bleu'" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()
