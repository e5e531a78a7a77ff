"""The policy server's engine watchdog, without vLLM: a dead engine turns health
NOT_SERVING and ends the watch, so that serve() stops the process (exit 1) and the container restarts.
tests/policy/test_integration.py kills a real engine."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from ragr1.services.common.server import GrpcServer
from ragr1.services.policy.server import EngineDied, watch_engine
from tests.common.waiting import holds_for_async


class Engine:
    def __init__(self, fails_after: int) -> None:
        self.checks = 0
        self.fails_after = fails_after

    async def check_health(self) -> None:
        self.checks += 1
        if self.checks > self.fails_after:
            raise RuntimeError("EngineCore died")


class Server:
    def __init__(self) -> None:
        self.serving: list[bool] = []

    async def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)


def test_a_dead_engine_turns_the_server_not_serving_and_ends_the_watch() -> None:
    engine, server = Engine(fails_after=3), Server()
    with pytest.raises(EngineDied, match="EngineCore died"):
        asyncio.run(asyncio.wait_for(watch_engine(engine, cast(GrpcServer, server), 0.01), 5))
    assert engine.checks == 4 and server.serving == [False]


def test_a_live_engine_is_watched_without_touching_health() -> None:
    engine, server = Engine(fails_after=10**9), Server()

    async def watch_a_while() -> None:
        task = asyncio.create_task(watch_engine(engine, cast(GrpcServer, server), 0.01))
        await holds_for_async(lambda: not task.done(), "the watch of a live engine goes on", 0.2)
        task.cancel()

    asyncio.run(watch_a_while())
    assert engine.checks > 3 and server.serving == []
