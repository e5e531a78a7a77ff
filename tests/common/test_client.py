"""The client base against a real server process with auth on: the token and a deadline reach every
call without the caller passing them, sync and async; health needs no token; service names come from
the stubs' descriptors; the context managers close their channels."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from ragr1.services.common.client import AsyncClient, ChannelOptions, HealthClient, service_name
from ragr1.services.policy.client import PolicyClient
from ragr1.services.retriever.client import AsyncShardClient, RetrieverClient
from ragr1.services.reward.client import RewardClient
from ragr1.services.trainer.client import TrainerClient
from ragr1.v1 import retriever_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.common.status_process import start_server

TOKEN = "attached-once"
SLOW = (("x-delay", "3"),)  # the test server's Status sleeps this long


class AsyncStatusClient(AsyncClient[trainer_pb2_grpc.TrainerStub]):
    """The async base on the test server's service (ragr1 itself calls Trainer.Status only synchronously)."""

    stub_type = trainer_pb2_grpc.TrainerStub


def test_service_names_come_from_the_stubs_descriptors() -> None:
    assert service_name(retriever_pb2_grpc.RetrieverShardStub) == "ragr1.v1.RetrieverShard"
    names = {cls.__name__: cls("127.0.0.1:1").service for cls in (RetrieverClient, RewardClient, PolicyClient)}
    assert names == {"RetrieverClient": "ragr1.v1.Retriever", "RewardClient": "ragr1.v1.Reward",
                     "PolicyClient": "ragr1.v1.Policy"}
    assert AsyncShardClient("127.0.0.1:1").service == "ragr1.v1.RetrieverShard"
    assert HealthClient("127.0.0.1:1").service == ""  # the whole server


def test_token_and_deadline_are_attached_once_sync_and_async(tmp_path: Path, port: int) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    options = ChannelOptions(token=TOKEN)
    with start_server(tmp_path, port, "--auth-token-file", str(token_file)):
        target = f"127.0.0.1:{port}"
        with TrainerClient(target, options, timeout=0.5) as client:
            assert client.status().step == 7  # no metadata argument: the channel adds the token
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as slow:
                client.stub.Status(trainer_pb2.StatusRequest(), metadata=SLOW)  # the client's deadline
            assert slow.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - start < 2.5
            # The call's own deadline wins over the client's; its own metadata keeps the token.
            assert client.stub.Status(trainer_pb2.StatusRequest(), metadata=(("x-delay", "0.6"),), timeout=5).step == 7
            assert client.health()
        with pytest.raises(ValueError, match="closed channel"):
            client.status()
        with TrainerClient(target, ChannelOptions(token="")) as anonymous:
            assert anonymous.health()  # probes need no token
            with pytest.raises(grpc.RpcError) as refused:
                anonymous.status()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

        async def scenario() -> tuple[int, grpc.StatusCode, bool]:
            async with AsyncStatusClient(target, options, timeout=0.5) as aclient:
                step = (await aclient.stub.Status(trainer_pb2.StatusRequest())).step
                try:
                    await aclient.stub.Status(trainer_pb2.StatusRequest(), metadata=SLOW)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                return step, code, await aclient.health()

        assert asyncio.run(scenario()) == (7, grpc.StatusCode.DEADLINE_EXCEEDED, True)
