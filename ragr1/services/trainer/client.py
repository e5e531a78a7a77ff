"""The client of ``Trainer.Status`` (the demo and operators poll it; nothing calls it from asyncio)."""

from __future__ import annotations

from ragr1.services.common.client import Client
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc


class TrainerClient(Client[trainer_pb2_grpc.TrainerStub]):
    stub_type = trainer_pb2_grpc.TrainerStub

    def status(self, timeout: float | None = None) -> trainer_pb2.StatusResponse:
        return self.stub.Status(trainer_pb2.StatusRequest(), timeout=timeout)

