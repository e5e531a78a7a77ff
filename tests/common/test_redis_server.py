"""``ragr1 redis``: its settings come from a file, the environment and flags; a bad one is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from ragr1.cli import main
from ragr1.services.common.redis_server import free_port


def test_redis_command_takes_its_settings_from_every_layer(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "redis.yaml").write_text(f"aof_dir: {tmp_path / 'aof'}\nhost: 0.0.0.0\n")
    env = {**os.environ, "RAGR1_PORT": str(port)}
    server = subprocess.Popen(
        [sys.executable, "-m", "ragr1", "redis", "--config", str(tmp_path / "redis.yaml"), "--host", "127.0.0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert server.stdout is not None
        ready = server.stdout.readline()
        assert ready.startswith(f"READY redis redis://127.0.0.1:{port}/0"), ready + server.stdout.read()
        assert f"data in {tmp_path / 'aof'}" in ready
        client = redis.Redis(port=port)
        client.set("k", "v")
        client.close()
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0
    assert (tmp_path / "aof" / "redis.log").exists()


def test_a_port_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["redis", "--port", "70000"]) == 2
    assert "port must be within [0, 65535], got 70000" in capsys.readouterr().err
