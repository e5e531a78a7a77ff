"""Runs a service as a child process and waits until its gRPC health check says SERVING.

Used by the local stack, benchmarks and tests that need real servers in real processes. A service
started on port 0 picks a free port; its ``READY <name> grpc=host:port metrics=port`` line (printed
by ``GrpcServer.serve``) tells which, so nothing needs fixed ports. Stopping sends SIGTERM (the
graceful path) and kills after a timeout, so no process outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ragr1.errors import ServiceCallError
from ragr1.services.common import lifeline
from ragr1.services.common.client import ChannelOptions, HealthClient


def wait_serving(target: str, timeout: float, options: ChannelOptions | None = None,
                 process: subprocess.Popen[bytes] | None = None, service: str = "") -> None:
    """Polls ``grpc.health.v1.Health/Check`` until SERVING; raises if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    with HealthClient(target, options) as client:
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"process for {target} exited with code {process.returncode}")
            try:
                if client.health(timeout=1.0, service=service):
                    return
            except ServiceCallError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target} not SERVING after {timeout:.0f}s")
            time.sleep(0.1)


def parse_ready(line: str) -> dict[str, str]:
    """``READY reward grpc=127.0.0.1:5 metrics=6`` -> ``{"name": "reward", "grpc": ..., "metrics": "6"}``."""
    _, name, *pairs = line.split()
    return {"name": name, **dict(pair.split("=", 1) for pair in pairs if "=" in pair)}


class ServiceProcess:
    """``python -m ragr1 serve ...`` (or any command) as a child, with its output in ``log_path``.

    ``target`` is the gRPC address to probe; ``None`` reads it from the READY line (port 0 services).
    """

    def __init__(self, name: str, args: Sequence[str], target: str | None, log_path: Path,
                 env: dict[str, str] | None = None, start_timeout: float = 120.0,
                 channel_options: ChannelOptions | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.target = target
        self.log_path = log_path
        self.env = env
        self.start_timeout = start_timeout
        self.channel_options = channel_options
        self.process: subprocess.Popen[bytes] | None = None
        self._launched = 0.0

    @classmethod
    def ragr1(cls, name: str, ragr1_args: Sequence[str], target: str | None, log_path: Path,
              **kwargs: object) -> ServiceProcess:
        return cls(name, [sys.executable, "-m", "ragr1", *ragr1_args], target, log_path, **kwargs)  # type: ignore[arg-type]

    def launch(self) -> ServiceProcess:
        """Starts the process without waiting (start several, then ``wait_started`` on each); what is left
        of a previous run of it is killed first."""
        self.reap()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Its own process group, so that its children go with it: vLLM's engine-core and worker
            # processes outlive a SIGKILLed (or OOM-killed) policy, holding gigabytes each, and a restarted
            # policy would find no memory for its KV cache. A container takes them all down; here ``reap``
            # does, and the lifeline does when this process itself dies.
            lifeline_env, lifeline_fds = lifeline.for_child()
            self.process = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(self.env or {}), **lifeline_env}, start_new_session=True,
                pass_fds=lifeline_fds,
            )
        self._launched = time.monotonic()
        return self

    def wait_started(self) -> ServiceProcess:
        """Waits for the READY line (port 0 services) and for SERVING; stops the process on failure."""
        try:
            if self.target is None:
                self.target = self.wait_ready(self.start_timeout)["grpc"]
            remaining = max(1.0, self.start_timeout - (time.monotonic() - self._launched))
            wait_serving(self.target, remaining, self.channel_options, self.process)
        except BaseException as exc:
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {exc}; log: {self.log_path}\n{self.log_tail()}") from exc
        return self

    def start(self) -> ServiceProcess:
        return self.launch().wait_started()

    def ready_lines(self) -> list[dict[str, str]]:
        """Every ``READY`` line the process printed so far, parsed."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [parse_ready(line) for line in text.splitlines() if line.startswith("READY ")]

    def wait_ready(self, timeout: float, name: str | None = None) -> dict[str, str]:
        """Waits for the READY line of ``name`` (default: the first that names a gRPC address)."""
        deadline = time.monotonic() + timeout
        while True:
            for ready in self.ready_lines():
                if ready["name"] == name or (name is None and "grpc" in ready):
                    return ready
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode} before READY")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} printed no READY line within {timeout:.0f}s")
            time.sleep(0.1)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(sig)

    def reap(self) -> None:
        """Kills whatever the exited process left running in its process group."""
        if self.process is None or self.process.poll() is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; then its leftover children; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reap()
        return self.process.returncode

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
