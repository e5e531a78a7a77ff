"""The policy's rate gauges when rollouts overlap (the async worker runs several groups at once): a replica's
tokens per second is its whole rate, not one group's, and retrieval waits that overlap are counted once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from ragr1.protocol.information import Passage
from ragr1.services.policy.activity import Busy, Window
from ragr1.services.policy.agent import Generation, GenerationRequest, Sampling, Trajectory
from ragr1.services.policy.rollouts import task_of
from tests.policy.scripted import ScriptedEngine, ScriptedSearch
from tests.policy.test_streaming import async_policy, task


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_counts_overlapping_activities_once() -> None:
    clock, counted = Clock(), []
    busy = Busy(counted.append, clock)
    busy.begin()  # 100: one starts
    clock.now = 101
    busy.begin()  # 101: a second starts beside it
    clock.now = 103
    busy.end()  # 103: the first ends
    clock.now = 104
    busy.end()  # 104: the second ends; nothing runs until 110
    clock.now = 110
    busy.begin()
    clock.now = 110.5
    assert busy.seconds() == 4.5  # 100-104 and 110-110.5, not 3 + 3 + 0.5
    assert sum(counted) == 4.5


def test_a_window_gives_the_growth_since_its_oldest_record() -> None:
    clock = Clock()
    window = Window(60.0, clock)
    assert window.growth(10.0, 1.0) == (0.0, 0.0)
    clock.now += 30
    assert window.growth(40.0, 4.0) == (30.0, 3.0)
    clock.now += 40  # the first record is 70 s old: out of the window
    assert window.growth(50.0, 6.0) == (10.0, 2.0)


QUESTIONS = [f"Who wrote book {i}?" for i in range(4)]


class SearchingEngine(ScriptedEngine):
    """Each question searches once, then answers; every generation takes 0.2 s, so calls overlap in time."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, {q: ["<search> author </search>", "<answer> someone </answer>"]
                                     for q in QUESTIONS})

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        await asyncio.sleep(0.2)
        return await super().generate(requests, sampling, stop)


class SlowSearch(ScriptedSearch):
    """Each search takes ``seconds``, as a retriever under load does."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        await asyncio.sleep(self.seconds)
        return await super().search(queries, groups)


def test_overlapping_rollouts_report_the_replicas_whole_rate_and_count_overlapping_waits_once(
    tokenizer: Any, policy_model_dir: Path
) -> None:
    """Four rollouts at once, each searching once (0.5 s): their searches overlap, so the trajectories' waits add
    up to more than the wall time, but the wait counted is at most the wall time; the tokens/s gauge is the four
    rollouts' rate, about four times any one call's tokens over its own time."""
    policy = async_policy(SearchingEngine(tokenizer), tokenizer, policy_model_dir)
    policy.loop.search.inner = SlowSearch(0.5)  # type: ignore[attr-defined]
    waited_before = REGISTRY.get_sample_value("ragr1_policy_retrieval_wait_seconds_total") or 0.0
    calls: list[tuple[int, float]] = []

    async def one(i: int) -> list[Trajectory]:
        start = time.perf_counter()
        trajectories = await policy.rollout([task_of(task(f"s{i}", QUESTIONS[i]))], Sampling())
        calls.append((sum(sum(t.loss_mask) for t in trajectories), time.perf_counter() - start))
        return trajectories

    async def scenario() -> list[list[Trajectory]]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    started = time.perf_counter()
    results = asyncio.run(scenario())
    wall = time.perf_counter() - started
    waits = [t.retrieval_seconds for trajectories in results for t in trajectories]
    assert all(t.retrieval_rounds == 1 for trajectories in results for t in trajectories)
    assert sum(waits) > wall  # the fault: the waits overlapped; summed, they would pass the wall time
    counted = (REGISTRY.get_sample_value("ragr1_policy_retrieval_wait_seconds_total") or 0.0) - waited_before
    assert 0.5 <= counted <= wall  # at least one search's sleep, at most the time it all took
    rate = REGISTRY.get_sample_value("ragr1_policy_generation_tokens_per_second")
    assert rate is not None
    assert rate > 2 * max(tokens / seconds for tokens, seconds in calls)  # four at once, not one call's rate
