"""The reward gRPC server."""

from __future__ import annotations

from ragr1.services.common.server import GrpcServer
from ragr1.services.reward.config import RewardConfig
from ragr1.services.reward.process_reward import LexicalRelevance
from ragr1.services.reward.scoring import RewardScorer
from ragr1.services.reward.servicer import RewardServicer
from ragr1.v1 import reward_pb2_grpc


async def build_server(config: RewardConfig) -> GrpcServer:
    """The server ready to ``serve()``; the config checked itself when it was made."""
    scorer = RewardScorer(config, LexicalRelevance() if config.relevance_weight > 0 else None)
    server = GrpcServer(config, "reward")
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, RewardServicer(scorer))
    return server


async def serve(config: RewardConfig) -> int:
    server = await build_server(config)
    return await server.serve()
