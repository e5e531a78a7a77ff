"""The waiting helpers: each returns as soon as what it waits on happens, and fails naming it and its bound."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from tests.common.waiting import (
    holds_for,
    holds_for_async,
    poll_until,
    wait_async,
    wait_event,
    wait_event_async,
    wait_for,
    wait_for_async,
)


def later(seconds: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_wait_for_returns_the_conditions_value_once_another_thread_makes_it_true() -> None:
    box: list[int] = []
    later(0.05, lambda: box.append(7))
    started = time.monotonic()
    assert wait_for(lambda: box[:1], "the value", 10, 0.01) == [7]
    assert time.monotonic() - started < 5  # returned on the change, not at the bound


def test_wait_for_fails_naming_what_and_its_bound() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"the flag was never set \(not within 0.1 s\)"):
        wait_for(lambda: False, "the flag was never set", 0.1, 0.01)
    assert time.monotonic() - started >= 0.1


def test_wait_for_reads_a_callable_message_at_the_failure() -> None:
    log = ["starting"]
    later(0.02, lambda: log.append("crashed"))
    with pytest.raises(AssertionError, match=r"never up: starting crashed \(not within 0.1 s\)"):
        wait_for(lambda: False, lambda: "never up: " + " ".join(log), 0.1, 0.01)


def test_wait_for_calls_its_step_before_each_check() -> None:
    ticks: list[int] = []
    assert wait_for(lambda: len(ticks) >= 3, "three ticks", 10, 0.001, step=lambda: ticks.append(1))
    assert len(ticks) == 3  # one step per check, the first before the first check


def test_wait_for_with_a_step_fails_when_the_steps_never_get_there() -> None:
    ticks: list[int] = []
    with pytest.raises(AssertionError, match="never reclaimed"):
        wait_for(lambda: False, "never reclaimed", 0.05, 0.01, step=lambda: ticks.append(1))
    assert len(ticks) >= 2


def test_wait_for_async_lets_the_loop_run_the_task_it_waits_on() -> None:
    async def scenario() -> None:
        box: list[str] = []

        async def producer() -> None:
            await asyncio.sleep(0.02)
            box.append("done")

        task = asyncio.create_task(producer())
        assert await wait_for_async(lambda: box, "the producer", 10) == ["done"]
        await task
        with pytest.raises(AssertionError, match=r"nothing \(not within 0.05 s\)"):
            await wait_for_async(lambda: False, "nothing", 0.05)

    asyncio.run(scenario())


def test_wait_for_async_awaits_a_coroutine_step() -> None:
    async def scenario() -> None:
        ticks: list[int] = []

        async def tick() -> None:
            await asyncio.sleep(0)
            ticks.append(1)

        await wait_for_async(lambda: len(ticks) == 2, "two ticks", 10, step=tick)
        assert ticks == [1, 1]

    asyncio.run(scenario())


def test_wait_for_async_awaits_a_coroutine_condition_and_returns_its_value() -> None:
    async def scenario() -> None:
        checks: list[int] = []

        async def third_check() -> str:
            await asyncio.sleep(0)
            checks.append(1)
            return "ready" if len(checks) == 3 else ""

        assert await wait_for_async(third_check, "the third check", 10) == "ready"
        assert len(checks) == 3
        with pytest.raises(AssertionError, match="never true"):
            await wait_for_async(lambda: asyncio.sleep(0, result=False), "never true", 0.05)

    asyncio.run(scenario())


def test_poll_until_returns_the_value_or_none_after_its_bound() -> None:
    box: list[int] = []
    later(0.02, lambda: box.append(1))
    assert poll_until(lambda: box[:1], 10, 0.01) == [1]
    started = time.monotonic()
    assert poll_until(lambda: [], 0.05, 0.01) is None
    assert time.monotonic() - started >= 0.05


def test_wait_event_returns_once_set_and_fails_naming_it() -> None:
    event = threading.Event()
    later(0.02, event.set)
    wait_event(event, "the event", 10)
    with pytest.raises(AssertionError, match=r"never set \(not within 0.05 s\)"):
        wait_event(threading.Event(), "never set", 0.05)


def test_the_async_event_and_awaitable_waits_fail_naming_what() -> None:
    async def scenario() -> None:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, event.set)
        await wait_event_async(event, "the event", 10)
        with pytest.raises(AssertionError, match=r"the quiet event \(not within 0.05 s\)"):
            await wait_event_async(asyncio.Event(), "the quiet event", 0.05)
        assert await wait_async(asyncio.sleep(0, "slept"), "a sleep", 10) == "slept"
        with pytest.raises(AssertionError, match="a long sleep"):
            await wait_async(asyncio.sleep(10), "a long sleep", 0.05)

    asyncio.run(scenario())


def test_holds_for_checks_throughout_its_period() -> None:
    checks: list[float] = []

    def check() -> bool:
        checks.append(time.monotonic())
        return True

    started = time.monotonic()
    holds_for(check, "always", 0.1, 0.01)
    assert checks[-1] - started >= 0.1  # held to the end of the stated period
    assert len(checks) >= 3  # and was checked along the way, not once


def test_holds_for_fails_at_the_first_violation_not_at_the_end() -> None:
    box: list[int] = []
    later(0.05, lambda: box.append(1))
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"nothing was appended: stopped holding after .* of 30 s"):
        holds_for(lambda: not box, "nothing was appended", 30, 0.01)
    assert time.monotonic() - started < 10


def test_holds_for_async_lets_the_loop_run_and_fails_at_a_violation() -> None:
    async def scenario() -> None:
        box: list[int] = []
        await holds_for_async(lambda: not box, "still empty", 0.05)
        asyncio.get_running_loop().call_later(0.02, box.append, 1)
        with pytest.raises(AssertionError, match="still empty: stopped holding"):
            await holds_for_async(lambda: not box, "still empty", 30)

    asyncio.run(asyncio.wait_for(scenario(), 10))
