"""The retriever and reward services behind the loop's protocols, through their shipped clients."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TypeVar

import grpc

from ragr1.errors import ServiceCallError
from ragr1.protocol.information import Passage
from ragr1.services.common.client import ChannelOptions
from ragr1.services.common.errors import Unavailable
from ragr1.services.retriever.client import AsyncRetrieverClient
from ragr1.services.reward.client import AsyncRewardClient
from ragr1.v1 import common_pb2, retriever_pb2, reward_pb2

T = TypeVar("T")


async def answered(call: Awaitable[T]) -> T:
    """``call``'s reply; a service that is down (UNAVAILABLE: not running, restarting, or a retriever missing a
    shard) raises ``Unavailable``, which the rollout worker does not hold against the prompt."""
    try:
        return await call
    except ServiceCallError as exc:
        if exc.code is grpc.StatusCode.UNAVAILABLE:
            raise Unavailable(str(exc)) from exc
        raise


class RetrieverSearch:
    """``SearchBackend`` over ``Retriever.Search``: one call per turn carries every query of the batch."""

    def __init__(
        self,
        address: str,
        *,
        top_k: int,
        timeout: float,
        dedup_within_group: bool = True,
        options: ChannelOptions | None = None,
    ) -> None:
        self.address = address
        self.top_k = top_k
        self.dedup_within_group = dedup_within_group
        self.client = AsyncRetrieverClient(address, options, timeout=timeout)
        self.calls = 0

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        self.calls += 1
        response = await answered(self.client.search(
            queries, self.top_k, groups=groups, dedup_within_group=self.dedup_within_group
        ))
        return [
            [Passage(p.id, p.title, p.text, p.score) for p in result.passages] for result in response.results
        ]

    async def info(self, timeout: float = 10.0) -> retriever_pb2.InfoResponse:
        """The router's description of its index (encoder, index type, corpus hash and size)."""
        return await self.client.info(timeout=timeout)

    async def close(self) -> None:
        await self.client.close()


class RewardServiceScorer:
    """The loop's ``Scorer`` over the reward service: batched scoring through ``Reward.Score`` (the reward
    core itself is ``reward.scoring.RewardScorer``)."""

    def __init__(self, address: str, *, timeout: float = 60.0, options: ChannelOptions | None = None) -> None:
        self.address = address
        self.client = AsyncRewardClient(address, options, timeout=timeout)

    async def score(self, items: Sequence[reward_pb2.ScoreItem]) -> list[common_pb2.RewardParts]:
        return await answered(self.client.score(items))

    async def close(self) -> None:
        await self.client.close()
