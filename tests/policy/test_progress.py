"""Liveness by progress (``progress.py``), on a clock the test moves: which held prompts keep their lease, and
that the engine and the loop stamp the prompt they work for through asyncio's context, whatever task they run in.
The worker under a hanging engine: tests/policy/test_worker_failures.py."""

from __future__ import annotations

import asyncio
from typing import Any

from ragr1.services.common.streams import Delivery
from ragr1.services.policy import progress
from ragr1.services.policy.progress import Held, Progress

STALL = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def deliveries(*ids: str) -> list[Delivery[Any]]:
    return [Delivery(entry_id, None) for entry_id in ids]


def test_a_started_prompt_keeps_its_lease_while_its_own_rollouts_advance() -> None:
    clock = Clock()
    held = Held(clock)
    held.add(deliveries("a", "b"))
    a, b = held.start(["a"]), held.start(["b"])
    clock.now = 8.0
    a.advanced()
    clock.now = 12.0  # a advanced 4 s ago; b not since it started 12 s ago
    assert held.leases(STALL) == (["a"], ["b"])
    b.advanced()
    assert held.leases(STALL) == (["a", "b"], [])
    held.drop("a")
    assert "a" not in held and len(held) == 1


def test_a_prompt_waiting_for_room_lives_while_the_running_ones_advance_and_lapses_with_them() -> None:
    clock = Clock()
    held = Held(clock)
    held.add(deliveries("running", "waiting"))
    running = held.start(["running"])
    clock.now = 15.0
    running.advanced()
    assert held.leases(STALL) == (["running", "waiting"], [])  # taken 15 s ago, but the replica advances
    clock.now = 30.0  # nothing advanced for 15 s: both lapse (a hung engine holds up both)
    assert held.leases(STALL) == ([], ["running", "waiting"])


def test_a_prompt_held_with_nothing_running_lives_by_its_own_take_time() -> None:
    clock = Clock()
    held = Held(clock)
    held.add(deliveries("x"))
    clock.now = 9.0
    assert held.leases(STALL) == (["x"], [])
    clock.now = 11.0
    assert held.leases(STALL) == ([], ["x"])


def test_what_runs_under_a_prompts_tracking_stamps_it_from_tasks_it_starts_and_nothing_else() -> None:
    clock = Clock()
    mine, other = Progress(clock), Progress(clock)

    async def engine_step() -> None:  # as the engine stamps each output, in a task of its own
        clock.now += 1.0
        progress.advanced()

    async def scenario() -> None:
        with progress.tracking(mine):
            await asyncio.gather(engine_step(), engine_step())
        progress.advanced()  # outside any prompt's work: stamps nothing

    asyncio.run(scenario())
    assert mine.at == 2.0 and other.at == 0.0
