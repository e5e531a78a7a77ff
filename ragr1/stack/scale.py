"""Scaling the policy replicas of a running local stack: ``ragr1 scale`` asks, the ``ragr1 up`` that owns the
run folder does it.

``ragr1 scale --run-dir DIR --policy-replicas N`` writes N to DIR/scale.json and waits until DIR/endpoints.json
lists N replicas, each serving. The ``ragr1 up`` of DIR reads the file between its looks at the services and
starts replicas (``policy-1``, ``policy-2``, ... beside ``policy``), or stops the newest ones with SIGTERM, as
``docker compose up --scale`` and a Kubernetes scale-down do: in-flight rollouts finish within the policy's
grace time and a stopped replica hands what it leaves unfinished back to the others. One process owns every
service, so the added replicas stop with the stack and die with it, and endpoints.json stays the one list.

A new replica needs nothing from the trainer: it loads the newest weight version announced in Redis before it
takes a prompt (``ragr1.services.policy.follower``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragr1.services.common.client import ChannelOptions
from ragr1.services.common.process import wait_serving
from ragr1.stack.auth import StackAuth
from ragr1.stack.config import ScaleConfig
from ragr1.stack.supervisor import ENDPOINTS, ServiceSpec, StackError, Supervisor

REQUEST = "scale.json"
# The first replica keeps the name every other part of the stack knows it by (``ragr1 eval``, the demo).
FIRST = "policy"
# A replica's shutdown: the policy's grace time for rollouts in flight, then some.
STOP_SECONDS = 130.0


def replica_name(i: int) -> str:
    return FIRST if i == 0 else f"{FIRST}-{i}"


def is_replica(name: str) -> bool:
    return name == FIRST or (name.startswith(FIRST + "-") and name[len(FIRST) + 1:].isdigit())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_endpoints(run_dir: Path) -> dict[str, Any]:
    """The running stack's endpoints.json; StackError when no ``ragr1 up`` runs for ``run_dir``."""
    path = run_dir / ENDPOINTS
    try:
        endpoints: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackError(f"{path} does not exist: {run_dir} is not the run folder of a running `ragr1 up`") from None
    except json.JSONDecodeError as exc:
        raise StackError(f"{path} is not JSON ({exc})") from None
    pid = endpoints.get("supervisor_pid")
    if not isinstance(pid, int) or not _alive(pid):
        raise StackError(f"the `ragr1 up` of {run_dir} is not running (its endpoints.json names pid {pid})")
    return endpoints


def replicas_of(endpoints: dict[str, Any]) -> dict[str, str]:
    """Replica name -> gRPC target, as the stack lists them."""
    return {name: info["grpc"] for name, info in endpoints.get("services", {}).items() if is_replica(name)}


def scale(config: ScaleConfig, poll_seconds: float = 1.0) -> dict[str, str]:
    """Asks the stack for ``config.policy_replicas`` replicas and waits until it has them, each serving;
    returns them (name -> gRPC target)."""
    run_dir = Path(config.run_dir).resolve()
    endpoints = read_endpoints(run_dir)
    tmp = run_dir / f".{REQUEST}.tmp"
    tmp.write_text(json.dumps({"policy_replicas": config.policy_replicas}) + "\n")
    tmp.replace(run_dir / REQUEST)
    secrets = endpoints.get("secrets")
    options = (StackAuth(Path(secrets["token_file"]), Path(secrets["redis_password_file"])).channel_options()
               if secrets else None)
    deadline = time.monotonic() + config.timeout
    while True:
        replicas = replicas_of(read_endpoints(run_dir))
        if len(replicas) == config.policy_replicas:
            for name, target in replicas.items():
                _serving(name, target, deadline, options, run_dir)
            return replicas
        if time.monotonic() > deadline:
            raise StackError(f"the stack has {len(replicas)} policy replicas after {config.timeout:.0f} s, not "
                             f"{config.policy_replicas}; see the `ragr1 up` output and {run_dir / 'logs'}")
        time.sleep(poll_seconds)


def _serving(name: str, target: str, deadline: float, options: ChannelOptions | None, run_dir: Path) -> None:
    try:
        wait_serving(target, max(1.0, deadline - time.monotonic()), options)
    except TimeoutError:
        raise StackError(f"{name} ({target}) is not serving yet; its log is {run_dir / 'logs' / name}.log") from None


class Scaler:
    """The ``ragr1 up`` side: ``tick`` applies a new request in ``run_dir``/scale.json. ``make_spec(i)`` is
    replica ``i``'s service."""

    def __init__(self, supervisor: Supervisor, make_spec: Callable[[int], ServiceSpec]) -> None:
        self.supervisor = supervisor
        self.make_spec = make_spec
        self.path = supervisor.run_dir / REQUEST
        # A request left by an earlier stack in the same folder is not this one's.
        self.path.unlink(missing_ok=True)

    def replicas(self) -> list[str]:
        return [spec.name for spec in self.supervisor.specs if is_replica(spec.name)]

    def wanted(self) -> int | None:
        """The replicas asked for since the last look (the request is taken: renamed, then read)."""
        taken = self.path.with_name(f".{REQUEST}.taken")
        try:
            self.path.replace(taken)
            wanted = json.loads(taken.read_text())["policy_replicas"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{self.path}: not a scale request ({exc}); ignored", flush=True)
            return None
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            print(f"{self.path}: policy_replicas must be a whole number >= 1, got {wanted!r}; ignored", flush=True)
            return None
        return wanted

    def tick(self) -> None:
        wanted = self.wanted()
        if wanted is None:
            return
        names = self.replicas()
        if wanted > len(names):
            taken = set(names)
            i = 0
            for _ in range(wanted - len(names)):
                while replica_name(i) in taken:
                    i += 1
                spec = self.make_spec(i)
                taken.add(spec.name)
                try:
                    # Not waiting for its health: the stack goes on watching the others meanwhile.
                    self.supervisor.add(spec, wait=False)
                except StackError as exc:
                    print(f"scale: {exc}", flush=True)
                    return
                print(f"scale: {spec.name} starting on {spec.target}; log {self.supervisor.log_dir / spec.name}.log",
                      flush=True)
        for name in reversed(names[wanted:]):
            print(f"scale: stopping {name} (in-flight rollouts finish in its grace time; the rest is handed back)",
                  flush=True)
            code = self.supervisor.remove(name, timeout=STOP_SECONDS)
            print(f"scale: {name} stopped (exit code {code})", flush=True)
