"""Clients of ``Trainer.Status``: ``TrainerClient`` (blocking; the demo and operators poll it) and
``AsyncTrainerClient`` (asyncio), twins. A failed call raises ``ragr1.errors.ServiceCallError``."""

from __future__ import annotations

from ragr1.services.common.client import AsyncClient, Client
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc


class TrainerClient(Client[trainer_pb2_grpc.TrainerStub]):
    stub_type = trainer_pb2_grpc.TrainerStub

    def status(self, timeout: float | None = None) -> trainer_pb2.StatusResponse:
        return self._call("Status", trainer_pb2.StatusRequest(), timeout)


class AsyncTrainerClient(AsyncClient[trainer_pb2_grpc.TrainerStub]):
    stub_type = trainer_pb2_grpc.TrainerStub

    async def status(self, timeout: float | None = None) -> trainer_pb2.StatusResponse:
        return await self._call("Status", trainer_pb2.StatusRequest(), timeout)
