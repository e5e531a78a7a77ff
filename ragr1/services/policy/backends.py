"""The retriever and reward services, reached through their gRPC contracts, behind the loop's protocols."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ragr1.agent.information import Passage
from ragr1.services.common.client import ChannelOptions, open_aio_channel
from ragr1.v1 import common_pb2, retriever_pb2, retriever_pb2_grpc, reward_pb2, reward_pb2_grpc


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
        self.timeout = timeout
        self.dedup_within_group = dedup_within_group
        self._options = options or ChannelOptions()
        self._channel: grpc.aio.Channel | None = None
        self.calls = 0

    def _stub(self) -> retriever_pb2_grpc.RetrieverStub:
        # Opened lazily so that the channel belongs to the event loop that uses it.
        if self._channel is None:
            self._channel = open_aio_channel(self.address, self._options)
        return retriever_pb2_grpc.RetrieverStub(self._channel)

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        self.calls += 1
        request = retriever_pb2.SearchRequest(
            queries=list(queries),
            top_k=self.top_k,
            groups=list(groups),
            dedup_within_group=self.dedup_within_group,
        )
        response = await self._stub().Search(request, timeout=self.timeout, metadata=self._options.metadata())
        return [
            [Passage(p.id, p.title, p.text, p.score) for p in result.passages] for result in response.results
        ]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class RewardScorer:
    """Batched scoring through ``Reward.Score``."""

    def __init__(self, address: str, *, timeout: float = 60.0, options: ChannelOptions | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self._options = options or ChannelOptions()
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> reward_pb2_grpc.RewardStub:
        if self._channel is None:
            self._channel = open_aio_channel(self.address, self._options)
        return reward_pb2_grpc.RewardStub(self._channel)

    async def score(self, items: Sequence[reward_pb2.ScoreItem]) -> list[common_pb2.RewardParts]:
        response = await self._stub().Score(
            reward_pb2.ScoreRequest(items=list(items)),
            timeout=self.timeout,
            metadata=self._options.metadata(),
        )
        if len(response.scores) != len(items):
            raise RuntimeError(
                f"reward service returned {len(response.scores)} scores for {len(items)} items"
            )
        return list(response.scores)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
