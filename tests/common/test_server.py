"""The common gRPC runtime, through real clients over loopback sockets against a server process."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ragr1.services.common.client import ChannelOptions, open_channel
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.server import LIVENESS
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc
from tests.common.pki import write_pki
from tests.common.status_process import start_server, status_code
from tests.common.waiting import wait_for


@pytest.fixture()
def server(tmp_path: Path, port: int) -> Iterator[tuple[ServiceProcess, int]]:
    with start_server(tmp_path, port, "--drain-seconds", "1") as proc:
        yield proc, port


def metrics_port_of(proc: ServiceProcess) -> int:
    return int(proc.wait_ready(timeout=5)["metrics"])


def test_reflection_health_and_metrics(server: tuple[ServiceProcess, int]) -> None:
    proc, port = server
    channel = open_channel(f"127.0.0.1:{port}")
    # Discover the services the way grpcurl does: through server reflection only.
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"ragr1.v1.Trainer", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    method = db.FindFileContainingSymbol("ragr1.v1.Trainer").service[0].method[0]
    assert (method.name, method.input_type) == ("Status", ".ragr1.v1.StatusRequest")

    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "ragr1.v1.Trainer", LIVENESS):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    stub = trainer_pb2_grpc.TrainerStub(channel)
    assert stub.Status(trainer_pb2.StatusRequest(), timeout=5).step == 7
    with pytest.raises(grpc.RpcError) as bad:
        stub.Status(trainer_pb2.StatusRequest(), metadata=(("x-delay", "-1"),), timeout=5)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-delay must be >= 0" in (bad.value.details() or "")
    with pytest.raises(grpc.RpcError) as late:
        stub.Status(trainer_pb2.StatusRequest(), metadata=(("x-delay", "5"),), timeout=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server is still fine after a bad call and an abandoned one.
    assert stub.Status(trainer_pb2.StatusRequest(), timeout=5).stage == "idle"
    channel.close()

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port_of(proc)}/metrics", timeout=5).read().decode()
    ok = 'ragr1_grpc_server_requests_total{code="OK",method="Status",service="status-test"}'
    bad_line = 'ragr1_grpc_server_requests_total{code="INVALID_ARGUMENT",method="Status",service="status-test"}'
    assert f"{ok} 2.0" in text
    assert f"{bad_line} 1.0" in text
    assert 'ragr1_grpc_server_handling_seconds_bucket{le="0.005",method="Status",service="status-test"}' in text
    assert 'ragr1_grpc_server_serving{service="status-test"} 1.0' in text


def test_sigterm_lets_in_flight_call_finish_after_health_goes_not_serving(
    server: tuple[ServiceProcess, int],
) -> None:
    proc, port = server
    channel = open_channel(f"127.0.0.1:{port}")
    stub = trainer_pb2_grpc.TrainerStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    events: list[tuple[str, float]] = []
    result: dict[str, object] = {}

    def slow_call() -> None:
        try:
            reply = stub.Status(trainer_pb2.StatusRequest(), metadata=(("x-delay", "3"),), timeout=30)
            result["reply"] = reply
        except grpc.RpcError as exc:  # pragma: no cover - reported by the assertion below
            result["error"] = exc
        events.append(("call_done", time.monotonic()))

    caller = threading.Thread(target=slow_call)
    caller.start()
    metrics = f"http://127.0.0.1:{metrics_port_of(proc)}/metrics"
    in_flight = 'ragr1_grpc_server_in_flight{service="status-test"} 1.0'
    wait_for(lambda: in_flight in urllib.request.urlopen(metrics, timeout=5).read().decode(),
             "the slow call never reached the server", 10, 0.05)
    proc.signal(signal.SIGTERM)

    def status(service: str) -> int:
        return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status

    wait_for(lambda: status("ragr1.v1.Trainer") == health_pb2.HealthCheckResponse.NOT_SERVING,
             "health never turned NOT_SERVING after SIGTERM", 5, 0.05)
    events.append(("not_serving", time.monotonic()))
    # A stopping server is not alive either: a liveness probe may replace it.
    assert status(LIVENESS) == health_pb2.HealthCheckResponse.NOT_SERVING
    caller.join(timeout=30)
    channel.close()
    assert "error" not in result, result.get("error")
    assert isinstance(result.get("reply"), trainer_pb2.StatusResponse)
    assert [name for name, _ in events] == ["not_serving", "call_done"]
    assert proc.process is not None
    assert proc.process.wait(timeout=20) == 0


def test_bearer_token_auth(tmp_path: Path, port: int) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    with start_server(tmp_path, port, "--auth-token-file", str(token_file)):
        target = f"127.0.0.1:{port}"
        for opts, expected in [
            (ChannelOptions(), grpc.StatusCode.UNAUTHENTICATED),
            (ChannelOptions(token="wrong"), grpc.StatusCode.UNAUTHENTICATED),
            (ChannelOptions(token="s3cret-token"), grpc.StatusCode.OK),
        ]:
            assert status_code(target, opts) == expected, opts
        # Probes need no secret.
        channel = open_channel(target)
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls(tmp_path: Path, port: int, mutual: bool) -> None:
    pki = write_pki(tmp_path)
    extra = ["--tls-cert-file", str(pki["server_cert"]), "--tls-key-file", str(pki["server_key"])]
    if mutual:
        extra += ["--tls-client-ca-file", str(pki["ca"])]
    with_ca = ChannelOptions(ca_file=str(pki["ca"]))
    with_client_cert = ChannelOptions(
        ca_file=str(pki["ca"]), cert_file=str(pki["client_cert"]), key_file=str(pki["client_key"])
    )
    with start_server(tmp_path, port, *extra, host="localhost", probe=with_client_cert):
        target = f"localhost:{port}"
        assert status_code(target, ChannelOptions()) == grpc.StatusCode.UNAVAILABLE  # plaintext refused
        if mutual:
            assert status_code(target, with_ca) == grpc.StatusCode.UNAVAILABLE  # no client certificate
            assert status_code(target, with_client_cert) == grpc.StatusCode.OK
        else:
            assert status_code(target, with_ca) == grpc.StatusCode.OK
