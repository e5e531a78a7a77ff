"""The container health probe against a real server process: 0 when SERVING, 1 when draining or absent."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ragr1.services.common.redis_server import free_port
from tests.common.status_process import start_server


def probe(target: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragr1.services.common.healthcheck", target, *extra],
        capture_output=True, text=True, timeout=60,
    )


def test_probe_follows_the_server_health(tmp_path: Path, port: int) -> None:
    with start_server(tmp_path, port, "--drain-seconds", "3") as proc:
        serving = probe(f"127.0.0.1:{port}", "--service", "ragr1.v1.Trainer")
        assert serving.returncode == 0, serving.stderr
        assert "SERVING" in serving.stdout
        # Draining after SIGTERM: health says NOT_SERVING, so the container is reported unhealthy.
        proc.signal(signal.SIGTERM)
        draining = probe(f"127.0.0.1:{port}", "--timeout", "1")
        assert draining.returncode == 1
        assert "not SERVING" in draining.stderr


def test_probe_fails_when_nothing_listens() -> None:
    result = probe(f"127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert result.returncode == 1
    assert "unhealthy" in result.stderr
