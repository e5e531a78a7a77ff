"""``ragr1 up``: the whole stack as local processes on loopback, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ragr1.model_paths import policy_checkpoint
from ragr1.shipped import ROOT
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig, UpConfig
from ragr1.stack.index_cache import ensure_index
from ragr1.stack.scale import Scaler, replica_name
from ragr1.stack.supervisor import RestartPolicy, ServiceSpec, Supervisor


def run_dir(config: StackConfig) -> Path:
    path = Path(config.run_dir) if config.run_dir else ROOT / "runs" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def start_stack(config: StackConfig, directory: Path, *, extra: Sequence[ServiceSpec] = (),
                reserved: Sequence[ServiceSpec] = (), model: Path | None = None, index_passages: int = 0,
                index_ids: set[str] | None = None, auth: bool = False) -> Supervisor:
    """Checks every port (``reserved``'s too: services started later), prepares the model and the index
    (the first ``index_passages`` of the shipped corpus, 0 for all, or the passages ``index_ids``), then
    starts the services (``extra`` after the core ones) and waits for their health. ``auth``: see
    ``Supervisor``."""
    ports = wiring.Ports.of(config)
    model = model or policy_checkpoint(config.model)

    # Specs first with a placeholder index path, so that ports are checked before minutes of indexing.
    def specs(index_dir: Path) -> list[ServiceSpec]:
        return [*wiring.retrieval_specs(config, ports, index_dir), wiring.reward_spec(config, ports),
                wiring.policy_spec(config, ports, model), *extra]

    Supervisor(directory, [*specs(directory), *reserved], ports.redis).check_ports()
    index_dir = ensure_index(index_passages, config.num_shards, config.index_type, config.max_passage_tokens,
                             ids=index_ids)
    supervisor = Supervisor(directory, specs(index_dir), ports.redis, auth=auth)
    print(f"starting {len(supervisor.specs)} services and Redis; logs in {supervisor.log_dir}", flush=True)
    return supervisor.start()


def describe(supervisor: Supervisor) -> str:
    lines = [f"  redis      {supervisor.redis.url if supervisor.redis else '-'}"]
    for name, info in supervisor.endpoints()["services"].items():
        extra = "  ".join(f"{k} {v}" for k, v in info.items() if k not in ("grpc", "metrics", "log"))
        lines.append(f"  {name:<20} grpc {info['grpc']}  metrics {info['metrics']}  {extra}".rstrip())
    lines.append(f"  endpoints  {supervisor.run_dir / 'endpoints.json'}")
    if supervisor.auth:
        lines.append(f"  token      {supervisor.auth.token_file} (gRPC: authorization: Bearer <token>)")
        lines.append(f"  redis password {supervisor.auth.redis_password_file}")
    return "\n".join(lines)


def wait_until_stopped(supervisor: Supervisor, restarts: RestartPolicy, poll_seconds: float = 1.0,
                       on_tick: Callable[[], None] | None = None) -> int:
    """Blocks until SIGINT/SIGTERM (exit 0) or a service that keeps dying (exit 1, with its log pointed
    to); a service that dies is restarted meanwhile. ``on_tick`` runs after each look."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(poll_seconds):
            reason = supervisor.watch(restarts)
            if reason is not None:
                print(reason, flush=True)
                return 1
            if on_tick is not None:
                on_tick()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def up(config: UpConfig) -> int:
    directory = run_dir(config)
    ports = wiring.Ports.of(config)
    model = policy_checkpoint(config.model)

    def replica(i: int) -> ServiceSpec:
        return wiring.policy_spec(config, ports, model, name=replica_name(i), port=ports.replica(i))

    extra = [replica(i) for i in range(1, config.policy_replicas)]
    if config.trainer:
        extra.append(wiring.trainer_spec(config, ports, model, directory / "checkpoints", {"max_updates": 0}))
    supervisor = start_stack(config, directory, extra=extra, model=model, index_passages=config.index_passages,
                             auth=config.auth)
    try:
        print("the stack is up:\n" + describe(supervisor), flush=True)
        print(f"Ctrl-C stops everything; `ragr1 scale --run-dir {directory} --policy-replicas N` adds or removes "
              "policy replicas.", flush=True)
        return wait_until_stopped(supervisor, RestartPolicy(max_restarts=config.max_restarts),
                                  on_tick=Scaler(supervisor, replica).tick)
    finally:
        print("stopping …", flush=True)
        supervisor.stop()
