"""A request body that does not parse gets INVALID_ARGUMENT (and is counted), not UNKNOWN."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import pytest

from ragr1.services.common.redis_server import free_port
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
