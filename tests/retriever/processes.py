"""Shard and router processes of a built index, started as a user starts them (``ragr1 serve ...``)."""

from __future__ import annotations

from pathlib import Path

from ragr1.services.common.process import ServiceProcess


def start_shards(index: Path, count: int, logs: Path, started: list[ServiceProcess], *extra: str) -> list[str]:
    common = ["serve", "retriever-shard", "--index", str(index), "--port", "0", "--metrics-port", "0"]
    procs = [
        ServiceProcess.ragr1(f"shard{i}", [*common, "--shard", str(i), *extra], None, logs / f"shard{i}.log").launch()
        for i in range(count)
    ]
    started += procs
    return [str(p.wait_started().target) for p in procs]


def start_router(
    index: Path, shards: list[str], logs: Path, started: list[ServiceProcess], *extra: str
) -> dict[str, str]:
    """Starts a router; returns its gRPC target and its HTTP and metrics URLs."""
    args = ["serve", "retriever", "--index", str(index), "--shards", ",".join(shards), "--port", "0"]
    p = ServiceProcess.ragr1(
        "router", [*args, "--metrics-port", "0", "--http-port", "0", *extra], None, logs / "router.log"
    )
    started.append(p)
    p.start()
    ready = p.wait_ready(10, "retriever")
    http = p.wait_ready(10, "retriever-http")["http"]
    return {"grpc": str(p.target), "http": http, "metrics": f"http://127.0.0.1:{ready['metrics']}/metrics"}
