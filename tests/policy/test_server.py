"""The policy server's engine watchdog, without vLLM's engine process: a dead engine, or one that has requests and
makes no step for stall_seconds, turns health NOT_SERVING and ends the watch, so that serve() stops the process
(exit 1: the rollout worker hands its prompts back as it leaves) and the container restarts; and what it reads of
``VllmEngine`` over a stand-in for vLLM's ``AsyncLLM``: the stall clock, and a weight load past its deadline.
tests/policy/test_integration.py kills a real engine; ``make test-faults`` stops one (SIGSTOP)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from ragr1.services.common.server import GrpcServer
from ragr1.services.policy.agent import GenerationRequest, Sampling
from ragr1.services.policy.engine import EngineSettings, VllmEngine
from ragr1.services.policy.server import EngineDied, watch_engine
from tests.common.waiting import holds_for_async

STALL = 30.0


class Engine:
    def __init__(self, fails_after: int, stalled: float = 0.0) -> None:
        self.checks = 0
        self.fails_after = fails_after
        self.stalled = stalled

    async def check_health(self) -> None:
        self.checks += 1
        if self.checks > self.fails_after:
            raise RuntimeError("EngineCore died")

    def stalled_seconds(self) -> float:
        return self.stalled if self.checks > 2 else 0.0


class Server:
    def __init__(self) -> None:
        self.serving: list[bool] = []

    async def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)


def test_a_dead_engine_turns_the_server_not_serving_and_ends_the_watch() -> None:
    engine, server = Engine(fails_after=3), Server()
    with pytest.raises(EngineDied, match="EngineCore died"):
        asyncio.run(asyncio.wait_for(watch_engine(engine, cast(GrpcServer, server), 0.01, STALL), 5))
    assert engine.checks == 4 and server.serving == [False]


def test_a_live_engine_is_watched_without_touching_health() -> None:
    engine, server = Engine(fails_after=10**9), Server()

    async def watch_a_while() -> None:
        task = asyncio.create_task(watch_engine(engine, cast(GrpcServer, server), 0.01, STALL))
        await holds_for_async(lambda: not task.done(), "the watch of a live engine goes on", 0.2)
        task.cancel()

    asyncio.run(watch_a_while())
    assert engine.checks > 3 and server.serving == []


def test_an_engine_with_requests_and_no_step_for_the_stall_limit_ends_the_watch_as_a_dead_one() -> None:
    # Stalled for longer than the limit from the third check: healthy by vLLM's own check all along.
    engine, server = Engine(fails_after=10**9, stalled=STALL + 1), Server()
    with pytest.raises(EngineDied, match=r"no step for 31 s with requests in hand \(stall_seconds 30\)"):
        asyncio.run(asyncio.wait_for(watch_engine(engine, cast(GrpcServer, server), 0.01, STALL), 5))
    assert engine.checks == 3 and server.serving == [False]
    # Slow is not stalled: a step within the limit keeps it serving.
    slow = Engine(fails_after=10**9, stalled=STALL - 1)

    async def watch_a_while() -> None:
        task = asyncio.create_task(watch_engine(slow, cast(GrpcServer, server), 0.01, STALL))
        await holds_for_async(lambda: not task.done(), "the watch of a slow engine goes on", 0.2)
        task.cancel()

    asyncio.run(watch_a_while())


class Output:
    """What vLLM's generate yields: one completion that has generated ``tokens`` so far."""

    def __init__(self, tokens: int) -> None:
        self.outputs = [SimpleNamespace(token_ids=list(range(tokens)), logprobs=None, stop_reason=None,
                                        finish_reason=None)]


class HangingLLM:
    """vLLM's AsyncLLM whose engine process stops after one step of each request, and whose weight loads never
    return (a collective that hangs)."""

    def __init__(self) -> None:
        self.stepped = asyncio.Event()

    async def generate(self, prompt: object, params: object, request_id: str) -> AsyncIterator[Output]:
        yield Output(1)
        self.stepped.set()
        await asyncio.Event().wait()  # no second step, ever
        yield Output(2)

    async def collective_rpc(self, method: str, kwargs: dict[str, object]) -> None:
        await asyncio.Event().wait()

    async def check_health(self) -> None:
        pass


def test_the_engine_counts_a_stall_only_while_it_has_requests_and_a_load_past_its_deadline_breaks_it() -> None:
    llm = HangingLLM()
    engine = VllmEngine(llm, EngineSettings(weight_load_timeout_seconds=0.2), Path("model"))

    async def scenario() -> None:
        assert engine.stalled_seconds() == 0.0  # no requests: idle is not stalled
        request = asyncio.ensure_future(engine.generate([GenerationRequest([1, 2, 3], 8, None)], Sampling(), []))
        await asyncio.wait_for(llm.stepped.wait(), 5)
        await asyncio.sleep(0.3)
        assert engine.stalled_seconds() >= 0.3  # the fault: a request in hand and no step since the first
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        assert engine.stalled_seconds() == 0.0
        await engine.check_health()
        with pytest.raises(TimeoutError, match=r"took longer than weight_load_timeout_seconds \(0.2 s\)"):
            await engine.reload_weights(Path("ckpt"))
        with pytest.raises(RuntimeError, match="took longer than weight_load_timeout_seconds"):
            await engine.check_health()  # broken for good: the watchdog stops the replica

    asyncio.run(asyncio.wait_for(scenario(), 10))


class PausedProcess(Engine):
    """A replica whose own process was stopped for a while (its worker SIGSTOPped): at the first look after, its
    engine's stall clock counts the pause, because the outputs the engine made meanwhile are still unread."""

    async def check_health(self) -> None:
        self.checks += 1
        if self.checks == 2:
            time.sleep(0.3)  # the process stopped after this look: nothing of it runs until the next

    def stalled_seconds(self) -> float:
        return STALL + 1 if self.checks == 3 else 0.0


def test_a_process_that_was_itself_stopped_does_not_take_its_own_pause_for_a_stalled_engine() -> None:
    engine, server = PausedProcess(fails_after=10**9), Server()

    async def watch_a_while() -> None:
        task = asyncio.create_task(watch_engine(engine, cast(GrpcServer, server), 0.01, STALL))
        await holds_for_async(lambda: not task.done(), "the watch goes on past the pause", 0.6)
        task.cancel()

    asyncio.run(watch_a_while())
    assert engine.checks > 3 and server.serving == []  # the fault: a look that saw the pause's stall, and let it be
