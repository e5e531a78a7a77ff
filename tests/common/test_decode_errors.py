"""A request body that does not parse gets INVALID_ARGUMENT (and is counted), not UNKNOWN."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from ragr1.services.common import errors
from ragr1.services.common.redis_server import free_port
from ragr1.services.common.server import _Interceptor
from tests.common.status_process import start_server


def test_undecodable_request_is_invalid_argument(tmp_path: Path, port: int) -> None:
    metrics_port = free_port()
    with start_server(tmp_path, port, metrics_port=metrics_port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = channel.unary_unary("/ragr1.v1.Trainer/Status")
            with pytest.raises(grpc.RpcError) as caught:
                status(b"\x0a\x05ab", timeout=5)  # field 1 announces 5 bytes, 2 follow
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request is not a valid message" in (caught.value.details() or "")
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        counted = 'ragr1_grpc_server_requests_total{code="INVALID_ARGUMENT",method="Status",service="status-test"} 1.0'
        assert counted in text


class _AbortingContext:
    """The two calls the interceptor makes on a failing call; ``abort`` notes what /metrics said when the
    status went out, as a real context sends it there and then."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self.counted_at_abort: float | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.counted_at_abort = self._read()
        raise grpc.aio.AbortError()

    def time_remaining(self) -> float | None:
        return None


@pytest.mark.parametrize("failure", [errors.InvalidArgument("bad"), RuntimeError("boom")], ids=["service", "internal"])
def test_a_failed_call_is_counted_before_its_status_goes_out(failure: Exception) -> None:
    code = "INVALID_ARGUMENT" if isinstance(failure, errors.ServiceError) else "INTERNAL"

    def read() -> float:
        labels = {"service": "order-test", "method": "Fail", "code": code}
        return REGISTRY.get_sample_value("ragr1_grpc_server_requests_total", labels) or 0.0

    def fail(request: object, context: object) -> None:
        raise failure

    before = read()
    context = _AbortingContext(read)
    behaviour = _Interceptor("order-test", None)._observed(fail, "Fail")
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(behaviour(object(), context))
    assert context.counted_at_abort == before + 1
    assert read() == before + 1
