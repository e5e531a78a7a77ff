"""The client base against a real server process with auth on: the token and a deadline reach every
call without the caller passing them, sync and async; health needs no token; service names come from
the stubs' descriptors; the context managers close their channels; a failed call raises
``ServiceCallError`` naming the call; every service's sync and async clients are twins."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import time
from pathlib import Path

import grpc
import pytest

from ragr1.errors import ServiceCallError
from ragr1.services.common.client import AsyncClient, ChannelOptions, Client, HealthClient, service_name
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.client import AsyncPolicyClient, PolicyClient
from ragr1.services.retriever.client import AsyncRetrieverClient, RetrieverClient
from ragr1.services.retriever.shard_client import AsyncShardClient
from ragr1.services.reward.client import AsyncRewardClient, RewardClient
from ragr1.services.trainer.client import AsyncTrainerClient, TrainerClient
from ragr1.v1 import retriever_pb2_grpc, trainer_pb2
from tests.common.status_process import start_server

TOKEN = "attached-once"
SLOW = (("x-delay", "3"),)  # the test server's Status sleeps this long
TWINS = [
    (RetrieverClient, AsyncRetrieverClient),
    (RewardClient, AsyncRewardClient),
    (PolicyClient, AsyncPolicyClient),
    (TrainerClient, AsyncTrainerClient),
]


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
            with pytest.raises(ServiceCallError) as refused:
                anonymous.status()
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED

        async def scenario() -> tuple[int, grpc.StatusCode, bool]:
            async with AsyncTrainerClient(target, options, timeout=0.5) as aclient:
                step = (await aclient.stub.Status(trainer_pb2.StatusRequest())).step
                try:
                    await aclient.stub.Status(trainer_pb2.StatusRequest(), metadata=SLOW)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                return step, code, await aclient.health()

        assert asyncio.run(scenario()) == (7, grpc.StatusCode.DEADLINE_EXCEEDED, True)


def test_a_failed_call_raises_one_type_naming_the_call_sync_and_async(tmp_path: Path, port: int) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    target = f"127.0.0.1:{port}"
    with start_server(tmp_path, port, "--auth-token-file", str(token_file)):
        with TrainerClient(target, ChannelOptions(token="wrong")) as client, pytest.raises(ServiceCallError) as sync:
            client.status(timeout=5)

        async def refused() -> ServiceCallError:
            async with AsyncTrainerClient(target, ChannelOptions(token="wrong")) as aclient:
                with pytest.raises(ServiceCallError) as caught:
                    await aclient.status(timeout=5)
                return caught.value

        errors = [sync.value, asyncio.run(refused())]
    for err in errors:
        assert (err.code, err.service, err.method, err.target) == (
            grpc.StatusCode.UNAUTHENTICATED, "ragr1.v1.Trainer", "Status", target)
        assert "bearer token" in err.message
        assert str(err) == f"ragr1.v1.Trainer/Status at {target}: UNAUTHENTICATED: {err.message}"
        assert isinstance(err.__cause__, grpc.RpcError)
        copy = pickle.loads(pickle.dumps(err))  # it crosses process boundaries whole (Ray, multiprocessing)
        assert (copy.code, copy.message, str(copy)) == (err.code, err.message, str(err))
    # Nothing listening: health raises the same type, for the health service, on one line.
    dead = f"127.0.0.1:{free_port()}"
    with HealthClient(dead) as probe, pytest.raises(ServiceCallError) as down:
        probe.health(timeout=5)
    assert (down.value.code, down.value.call, down.value.target) == (
        grpc.StatusCode.UNAVAILABLE, "grpc.health.v1.Health/Check", dead)
    assert "\n" not in str(down.value)


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=[s.__name__ for s, _ in TWINS])
def test_sync_and_async_clients_are_twins(sync: type[Client], aio: type[AsyncClient]) -> None:
    """Same methods with the same arguments and defaults (deadlines included), one blocking, one a coroutine."""

    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(f) for name, f in inspect.getmembers(cls, inspect.isfunction)
                if not name.startswith("_") and name not in ("close",)}

    mine, theirs = methods(sync), methods(aio)
    assert mine.keys() == theirs.keys()
    own = set(mine) - {"health"}
    assert own, f"{sync.__name__} has no methods of its own"
    for name in mine:
        assert str(mine[name]) == str(theirs[name]), name
        assert inspect.iscoroutinefunction(getattr(aio, name)) and not inspect.iscoroutinefunction(getattr(sync, name))
        assert "timeout" in mine[name].parameters, f"{sync.__name__}.{name} takes no deadline"
    assert (sync.stub_type, sync.default_timeout) == (aio.stub_type, aio.default_timeout)
