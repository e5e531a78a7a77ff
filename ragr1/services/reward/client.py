"""Clients of the reward service: ``RewardClient`` (blocking) and ``AsyncRewardClient`` (asyncio), twins.
Every call takes a ``timeout`` in seconds (``None``: the client's default) and raises
``ragr1.errors.ServiceCallError`` when it fails (INVALID_ARGUMENT for bad input).

    with RewardClient("127.0.0.1:50053") as reward:
        parts = reward.score([reward_pb2.ScoreItem(response=text, golden_answers=["Paris"])])
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ragr1.errors import ServiceCallError
from ragr1.services.common.client import AsyncClient, Client, sequence_of
from ragr1.v1 import common_pb2, reward_pb2, reward_pb2_grpc

DEFAULT_TIMEOUT = 30.0


def _scores(client: RewardClient | AsyncRewardClient, reply: reward_pb2.ScoreResponse,
            sent: int) -> list[common_pb2.RewardParts]:
    if len(reply.scores) != sent:
        raise ServiceCallError(
            grpc.StatusCode.INTERNAL, f"the service returned {len(reply.scores)} scores for {sent} items",
            service=client.service, method="Score", target=client.target,
        )
    return list(reply.scores)


def _score_request(items: Sequence[reward_pb2.ScoreItem]) -> reward_pb2.ScoreRequest:
    return reward_pb2.ScoreRequest(items=sequence_of("items", items, reward_pb2.ScoreItem))


class RewardClient(Client[reward_pb2_grpc.RewardStub]):
    stub_type = reward_pb2_grpc.RewardStub
    default_timeout = DEFAULT_TIMEOUT

    def score(
        self, items: Sequence[reward_pb2.ScoreItem], timeout: float | None = None
    ) -> list[common_pb2.RewardParts]:
        """One RewardParts per item, in order."""
        return _scores(self, self._call("Score", lambda: _score_request(items), timeout), len(items))


class AsyncRewardClient(AsyncClient[reward_pb2_grpc.RewardStub]):
    stub_type = reward_pb2_grpc.RewardStub
    default_timeout = DEFAULT_TIMEOUT

    async def score(
        self, items: Sequence[reward_pb2.ScoreItem], timeout: float | None = None
    ) -> list[common_pb2.RewardParts]:
        """One RewardParts per item, in order."""
        return _scores(self, await self._call("Score", lambda: _score_request(items), timeout), len(items))
