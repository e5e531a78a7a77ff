"""The test server of ``tests/common/status_server.py`` in a process of its own, as the services run,
and the status code a ``Status`` call to it ends with."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc

from ragr1.services.common.client import ChannelOptions, open_channel
from ragr1.services.common.process import ServiceProcess
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc


def start_server(tmp_path: Path, port: int, *extra: str, host: str = "127.0.0.1", metrics_port: int = 0,
                 probe: ChannelOptions | None = None) -> ServiceProcess:
    """The server, not yet started (use it as a context manager); ``probe`` is how its readiness check
    connects (TLS, a client certificate), ``metrics_port`` 0 lets the server pick a free one."""
    return ServiceProcess(
        "status-test",
        [sys.executable, "-m", "tests.common.status_server", "--host", host, "--port", str(port),
         "--metrics-port", str(metrics_port), *extra],
        target=f"{host}:{port}",
        log_path=tmp_path / "server.log",
        start_timeout=30,
        channel_options=probe,
    )


def status_code(target: str, options: ChannelOptions) -> grpc.StatusCode:
    channel = open_channel(target, options)
    try:
        trainer_pb2_grpc.TrainerStub(channel).Status(trainer_pb2.StatusRequest(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        channel.close()
