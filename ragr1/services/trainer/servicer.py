"""``Trainer.Status``: the loop's status, translated to protobuf."""

from __future__ import annotations

from typing import Any

from ragr1.services.trainer.loop.ppo_loop import TrainerStatus
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, status: TrainerStatus) -> None:
        self.status = status

    def Status(self, request: trainer_pb2.StatusRequest, context: Any) -> trainer_pb2.StatusResponse:
        s = self.status
        return trainer_pb2.StatusResponse(
            stage=s.stage,
            step=s.step,
            policy_version=s.policy_version,
            rollouts_trained=s.rollouts_trained,
            rollouts_dropped_stale=s.rollouts_dropped_stale,
            last_mean_reward=s.last_mean_reward,
            checkpoint_path=s.checkpoint_path,
            last_logprob_gap=s.last_logprob_gap,
            weight_sync_alarms=s.weight_sync_alarms,
        )
