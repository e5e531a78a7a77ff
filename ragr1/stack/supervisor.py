"""Starts a set of services as local processes, in order, and owns them until it stops them.

Every port is checked before anything starts (a port in use stops the command before it starts
anything half-way); each service's log goes to its own file; a service that dies is restarted with
backoff (``watch``, as compose's ``restart: unless-stopped`` and Kubernetes do), or named with its log
once it keeps dying; stopping sends SIGTERM in reverse order and kills what does not exit, so no process
outlives the supervisor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ragr1.services.common.config import setting
from ragr1.services.common.ports import port_in_use
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import RedisServer
from ragr1.stack.auth import StackAuth

# What a running stack writes into its run folder: every service's addresses (``ragr1 eval`` and
# ``ragr1 scale`` read it).
ENDPOINTS = "endpoints.json"


@dataclasses.dataclass
class ServiceSpec:
    """One service of the stack: ``ragr1 <args>`` serving gRPC on ``port``."""

    name: str
    args: list[str]
    port: int
    metrics_port: int
    # The stack's start_timeout setting (its one default is there).
    start_timeout: float
    host: str = "127.0.0.1"
    # Other endpoints a user may want (e.g. the router's HTTP endpoint), name -> URL.
    extra: dict[str, str] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


RESTART_WINDOW_SECONDS = 600.0


@dataclasses.dataclass
class RestartPolicy:
    """When a dead service is started again. More than ``max_restarts`` restarts of one service within
    ``window_seconds`` means it will keep dying: the supervisor gives up (0: give up at the first death)."""

    max_restarts: int = setting(
        5, f"restarts of a service that dies (with backoff) within {RESTART_WINDOW_SECONDS:.0f} s before the "
        "stack stops; 0: stop at the first death",
    )
    window_seconds: float = RESTART_WINDOW_SECONDS
    # The n-th restart within the window waits first_backoff * 2**(n-1) seconds, at most max_backoff.
    first_backoff: float = 1.0
    max_backoff: float = 30.0

    def backoff(self, recent: int) -> float:
        return float(min(self.max_backoff, self.first_backoff * 2**recent))


class StackError(RuntimeError):
    """A service could not start or died; the message names it and its log."""


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM only print a line while the block runs (signal handlers belong to the main
    thread: elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, _frame: object) -> None:
        print(f"{signal.Signals(signum).name}: still stopping the services; this ends on its own", flush=True)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Supervisor:
    def __init__(self, run_dir: Path, specs: Sequence[ServiceSpec], redis_port: int, *, auth: bool = False) -> None:
        """``auth``: a bearer token on every gRPC call and a Redis password (``StackAuth``, in
        run_dir/secrets); the owner's own clients take ``self.auth.channel_options()`` and ``redis.client()``."""
        self.run_dir = run_dir
        self.specs = list(specs)
        self.redis_port = redis_port
        self.auth = StackAuth.create(run_dir / "secrets") if auth else None
        self.redis: RedisServer | None = None
        self.processes: dict[str, ServiceProcess] = {}
        # Per service (redis included): when it was restarted, and when it is due to be (after its backoff).
        self.restarts: dict[str, list[float]] = {}
        self._due: dict[str, float] = {}

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def check_ports(self) -> None:
        wanted = [("redis", "127.0.0.1", self.redis_port)]
        for spec in self.specs:
            wanted += [(spec.name, spec.host, spec.port), (f"{spec.name} metrics", spec.host, spec.metrics_port)]
        seen: dict[int, str] = {}
        for name, host, port in wanted:
            if port in seen:
                raise StackError(f"port {port} is configured twice ({seen[port]} and {name}); choose another")
            seen[port] = name
            if port_in_use(host, port):
                raise StackError(
                    f"port {port} ({name}) is already in use on {host}: stop what holds it "
                    f"(`ss -ltnp | grep :{port}`) or pick other ports with --base-port"
                )

    def start(self) -> Supervisor:
        """Starts Redis and every service; a supervisor already started is returned as it is (so that
        ``with start_stack(...) as s:`` neither starts twice nor leaves processes behind)."""
        if self.redis is not None:
            return self
        self.check_ports()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis = RedisServer(port=self.redis_port, data_dir=self.run_dir / "redis",
                                     password=self.auth.redis_password if self.auth else "").start()
            for spec in self.specs:
                self._start(spec)
        except BaseException:
            self.stop()
            raise
        self.write_endpoints()
        return self

    def _start(self, spec: ServiceSpec, *, wait: bool = True) -> ServiceProcess:
        proc = ServiceProcess.ragr1(
            spec.name, spec.args, spec.target, self.log_dir / f"{spec.name}.log",
            start_timeout=spec.start_timeout, env={**(self.auth.env() if self.auth else {}), **spec.env} or None,
        )
        self.processes[spec.name] = proc
        if not wait:
            return proc.launch()
        try:
            return proc.start()
        except RuntimeError as exc:
            raise StackError(
                f"{spec.name} did not start; its log is {proc.log_path}\n{proc.log_tail(1500)}"
            ) from exc

    def add(self, spec: ServiceSpec, *, wait: bool = True) -> ServiceProcess:
        """Starts one more service in the running stack (it is stopped with the rest). ``wait``: until it is
        healthy; else it is launched and, should it die, restarted by ``watch`` like the others."""
        if spec.name in self.processes:
            raise StackError(f"the stack runs a service named {spec.name} already")
        if port_in_use(spec.host, spec.port) or port_in_use(spec.host, spec.metrics_port):
            raise StackError(f"port {spec.port} or {spec.metrics_port} ({spec.name}) is already in use")
        self.specs.append(spec)
        try:
            proc = self._start(spec, wait=wait)
        except BaseException:
            self.specs.remove(spec)
            self.processes.pop(spec.name, None)
            raise
        self.write_endpoints()
        return proc

    def remove(self, name: str, *, timeout: float = 30.0, sig: int = signal.SIGTERM) -> int | None:
        """Takes a service out of the running stack: ``sig`` (SIGTERM: it stops as it would on a scale-down,
        SIGKILL: as a lost node), SIGKILL after ``timeout``; it is not restarted. Returns its exit code."""
        proc = self.processes.pop(name)
        self.specs = [spec for spec in self.specs if spec.name != name]
        self.restarts.pop(name, None)
        self._due.pop(name, None)
        if sig != signal.SIGTERM:  # ``stop`` sends SIGTERM itself, once
            proc.signal(sig)
        code = proc.stop(timeout=timeout)
        self.write_endpoints()
        return code

    def endpoints(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            # Who owns these services (``ragr1 scale`` asks it for more or fewer policy replicas).
            "supervisor_pid": os.getpid(),
            "redis": self.redis.url if self.redis else None,
            "logs": str(self.log_dir),
            "services": {},
        }
        if self.auth:
            out["secrets"] = self.auth.describe()
        for spec in self.specs:
            out["services"][spec.name] = {
                "grpc": spec.target,
                "metrics": f"http://{spec.host}:{spec.metrics_port}/metrics",
                "log": str(self.log_dir / f"{spec.name}.log"),
                "restarts": len(self.restarts.get(spec.name, [])),
                **spec.extra,
            }
        out["redis_restarts"] = len(self.restarts.get("redis", []))
        return out

    def write_endpoints(self) -> Path:
        path = self.run_dir / ENDPOINTS
        path.write_text(json.dumps(self.endpoints(), indent=2) + "\n")
        return path

    def dead(self) -> list[str]:
        """Services whose process has exited (redis included)."""
        gone = [name for name, proc in self.processes.items() if not proc.alive()]
        if self.redis is not None and (self.redis.process is None or self.redis.process.poll() is not None):
            gone.insert(0, "redis")
        return gone

    def describe_death(self, name: str) -> str:
        if name == "redis":
            return f"redis died; its log is {self._log_path(name)}"
        proc = self.processes[name]
        return f"{name} died (exit code {self._exit_code(name)}); its log is {proc.log_path}\n{proc.log_tail(1500)}"

    def watch(self, policy: RestartPolicy, now: float | None = None) -> str | None:
        """One look at every process: a dead one is restarted once its backoff has passed; returns why the
        stack must stop (a service that keeps dying, named with its log) or None."""
        now = time.monotonic() if now is None else now
        for name in self.dead():
            recent = [t for t in self.restarts.get(name, []) if now - t < policy.window_seconds]
            if len(recent) >= policy.max_restarts:
                return (f"{self.describe_death(name)}\ngave up: restarted {len(recent)} times in the last "
                        f"{policy.window_seconds:.0f} s")
            due = self._due.setdefault(name, now + policy.backoff(len(recent)))
            if now < due:
                continue
            del self._due[name]
            self.restarts.setdefault(name, []).append(now)
            print(f"{name} died (exit code {self._exit_code(name)}); restart {len(recent) + 1} of at most "
                  f"{policy.max_restarts} in {policy.window_seconds:.0f} s; log "
                  f"{self._log_path(name)}", flush=True)
            try:
                self._restart(name)
            except (RuntimeError, TimeoutError) as exc:  # counted: the next look sees it dead again
                print(f"{name} did not come back: {exc}", flush=True)
            self.write_endpoints()
        return None

    def _restart(self, name: str) -> None:
        if name == "redis":
            assert self.redis is not None
            self.redis.stop()  # a dead process: only forgets it; the append-only file stays in run_dir/redis
            self.redis.start()
        else:
            self.processes[name].launch()  # not waiting for health: a restart that dies is seen next time

    def _exit_code(self, name: str) -> int | None:
        process = self.redis.process if name == "redis" and self.redis else self.processes[name].process
        return process.poll() if process is not None else None

    def _log_path(self, name: str) -> Path:
        return self.run_dir / "redis" / "redis.log" if name == "redis" else self.processes[name].log_path

    def stop(self) -> None:
        """Stops every service and Redis. A Ctrl-C or SIGTERM meanwhile (a user pressing Ctrl-C again) is
        noted, not obeyed: the services run in process groups of their own, which a terminal's signal does
        not reach, so a stop cut short would leave them running. Each stop is bounded (SIGKILL after 30 s)."""
        with _signals_held():
            for name in reversed(list(self.processes)):
                self.processes[name].stop(timeout=30)
            self.processes.clear()
            if self.redis is not None:
                self.redis.stop()
                self.redis = None

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
