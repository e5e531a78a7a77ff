"""A server built with the common runtime, for testing the runtime itself in its own process.

It serves ``ragr1.v1.Trainer`` whose ``Status`` sleeps for the seconds given in the ``x-delay``
metadata (so tests can hold a call in flight) and raises the core's InvalidArgument for a negative
delay (so tests see the error mapping). Run: ``python -m tests.common.status_server --port N ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from ragr1.services.common import config, errors
from ragr1.services.common.server import GrpcServer, ServerConfig
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc


@dataclasses.dataclass
class StatusConfig(ServerConfig):
    port: int = config.setting(0, "gRPC port; 0 picks a free one")


class SlowStatus(trainer_pb2_grpc.TrainerServicer):
    async def Status(self, request: trainer_pb2.StatusRequest, context: Any) -> trainer_pb2.StatusResponse:
        delay = float(dict(context.invocation_metadata()).get("x-delay", "0"))
        if delay < 0:
            raise errors.InvalidArgument(f"x-delay must be >= 0, got {delay}")
        await asyncio.sleep(delay)
        return trainer_pb2.StatusResponse(stage="idle", step=7)


def build(cfg: ServerConfig) -> GrpcServer:
    server = GrpcServer(cfg, "status-test")
    server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, SlowStatus())
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, StatusConfig)
    cfg = config.from_args(StatusConfig, parser.parse_args())
    asyncio.run(build(cfg).serve())


if __name__ == "__main__":
    main()
