"""A client refuses arguments of the wrong type before sending anything, with ``ServiceCallError``
(INVALID_ARGUMENT) naming the argument: a bare string is not a list of queries (protobuf would send one
query per character), ``top_k="3"`` is not an int. Sync and async twins alike; no server is needed,
since nothing may be sent (the address is a closed port)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest

from ragr1.errors import ServiceCallError
from ragr1.services.policy.client import AsyncPolicyClient, PolicyClient
from ragr1.services.retriever.client import AsyncRetrieverClient, RetrieverClient
from ragr1.services.reward.client import AsyncRewardClient, RewardClient

NOWHERE = "127.0.0.1:1"

# (client pair, method, args, kwargs, the argument the message must name)
REFUSED = [
    ((RetrieverClient, AsyncRetrieverClient), "search", ("who wrote hamlet",), {}, "queries"),
    ((RetrieverClient, AsyncRetrieverClient), "search", (["who wrote hamlet"],), {"top_k": "3"}, "top_k"),
    ((RetrieverClient, AsyncRetrieverClient), "search", ([b"bytes"],), {}, "queries[0]"),
    ((RetrieverClient, AsyncRetrieverClient), "search", (["q"],), {"groups": [0.5]}, "groups[0]"),
    ((RetrieverClient, AsyncRetrieverClient), "search", (["q", "r"],), {"groups": [0, True]}, "groups[1]"),
    ((RetrieverClient, AsyncRetrieverClient), "search", (["q"],), {"groups": "0"}, "groups"),
    ((RetrieverClient, AsyncRetrieverClient), "search", (["q"],), {"top_k": True}, "top_k"),
    ((RewardClient, AsyncRewardClient), "score", ("an answer",), {}, "items"),
    ((PolicyClient, AsyncPolicyClient), "generate", ("a prompt",), {}, "prompts"),
    ((PolicyClient, AsyncPolicyClient), "rollout", (["Who wrote Hamlet?"],), {}, "tasks[0]"),
    ((PolicyClient, AsyncPolicyClient), "update_weights", ("3", "/ckpt"), {}, "version"),
]


def _check(err: ServiceCallError, method: str, argument: str) -> None:
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith(f"{argument} must be"), err.message
    assert err.target == NOWHERE and err.method


@pytest.mark.parametrize(("pair", "method", "args", "kwargs", "argument"), REFUSED,
                         ids=[f"{p[0].__name__}.{m}-{a}" for p, m, _, _, a in REFUSED])
def test_sync_client_refuses_wrong_types(pair: tuple[type, type], method: str, args: tuple[Any, ...],
                                         kwargs: dict[str, Any], argument: str) -> None:
    with pair[0](NOWHERE, timeout=0.2) as client, pytest.raises(ServiceCallError) as refused:
        getattr(client, method)(*args, **kwargs)
    _check(refused.value, method, argument)


@pytest.mark.parametrize(("pair", "method", "args", "kwargs", "argument"), REFUSED,
                         ids=[f"{p[1].__name__}.{m}-{a}" for p, m, _, _, a in REFUSED])
def test_async_client_refuses_wrong_types(pair: tuple[type, type], method: str, args: tuple[Any, ...],
                                          kwargs: dict[str, Any], argument: str) -> None:
    async def call() -> None:
        async with pair[1](NOWHERE, timeout=0.2) as client:
            await getattr(client, method)(*args, **kwargs)

    with pytest.raises(ServiceCallError) as refused:
        asyncio.run(call())
    _check(refused.value, method, argument)


def test_right_types_reach_the_network() -> None:
    """The checks let good arguments through (a tuple, numpy's ints): the call is made, and fails only for
    want of a server."""
    with RetrieverClient(NOWHERE, timeout=0.2) as client, pytest.raises(ServiceCallError) as failed:
        client.search(("who wrote hamlet", "hamlet author"), top_k=np.int64(3), groups=np.array([0, 0]))
    assert failed.value.code is grpc.StatusCode.UNAVAILABLE
