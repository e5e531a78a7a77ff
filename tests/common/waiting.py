"""Waiting in tests: on events, not clocks.

A test that sleeps for a guessed time and then asserts is slow where the guess is generous and flaky where the
host is busier than the guess allowed for. The tests wait instead for the thing they need: an event the code
under test sets where it can signal one (``wait_event``), else a condition polled until it holds, under a
bound that only fails the test and never paces it (``wait_for``; with ``step=`` where each poll does the work
that makes progress, such as a reclaim; ``poll_until`` for the long-run harnesses, which report a timeout
instead of failing). Every bound names what was awaited and how long, so a failure says
what never happened rather than timing out anonymously.

Negative checks ("nothing happened") cannot wait for an event: the absence of one is only ever established for
a stated period. ``holds_for`` makes that period explicit, and checks the condition throughout it, so it fails
at the first violation instead of only at the end.

Each has an asyncio twin (``..._async``) that yields to the event loop between polls, for tests whose code under
test runs as tasks on the same loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


# What was awaited: a callable where the message needs the state at the failure (a log's tail).
What = str | Callable[[], str]


def _timed_out(what: What, seconds: float) -> str:
    return f"{what if isinstance(what, str) else what()} (not within {seconds:g} s)"


def poll_until(
    condition: Callable[[], T], seconds: float, poll: float, *, step: Callable[[], object] | None = None
) -> T | None:
    """Returns ``condition()``'s first truthy value, or None once ``seconds`` pass first (its last check at the
    bound or after it); calls ``step()`` before each check where given. For the long-run harnesses, which
    report a timeout in their own terms rather than fail a test; tests use ``wait_for``."""
    deadline = time.monotonic() + seconds
    while True:
        if step is not None:
            step()
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)


def wait_for(
    condition: Callable[[], T], what: What, seconds: float = 120.0, poll: float = 0.2, *,
    step: Callable[[], object] | None = None,
) -> T:
    """Returns ``condition()``'s first truthy value; calls ``step()`` before each check where given (the work
    that makes progress). Fails the test, naming ``what``, once ``seconds`` pass first."""
    value = poll_until(condition, seconds, poll, step=step)
    assert value, _timed_out(what, seconds)
    return value


async def wait_for_async(
    condition: Callable[[], T | Awaitable[T]], what: What, seconds: float = 60.0, poll: float = 0.01, *,
    step: Callable[[], object] | None = None,
) -> T:
    """``wait_for`` on an event loop: the loop runs other tasks between checks. ``condition`` and ``step`` may be
    coroutine functions (a check that calls Redis off the loop: ``lambda: asyncio.to_thread(...)``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        if step is not None:
            stepped = step()
            if inspect.isawaitable(stepped):
                await stepped
        checked = condition()
        value = await checked if inspect.isawaitable(checked) else checked
        if value:
            return value
        assert loop.time() < deadline, _timed_out(what, seconds)
        await asyncio.sleep(poll)


def wait_event(event: threading.Event, what: str, seconds: float = 60.0) -> None:
    """Returns once ``event`` is set; fails the test, naming ``what``, once ``seconds`` pass first."""
    assert event.wait(seconds), _timed_out(what, seconds)


async def wait_event_async(event: asyncio.Event, what: str, seconds: float = 60.0) -> None:
    """``wait_event`` for an ``asyncio.Event``."""
    await wait_async(event.wait(), what, seconds)


async def wait_async(awaitable: Awaitable[T], what: str, seconds: float = 60.0) -> T:
    """``await awaitable`` under a bound that fails the test naming ``what`` (where ``asyncio.wait_for`` raises a
    bare ``TimeoutError``)."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(_timed_out(what, seconds)) from None


def _violated(what: str, after: float, seconds: float) -> str:
    return f"{what}: stopped holding after {after:.2f} s of {seconds:g} s"


def holds_for(condition: Callable[[], object], what: str, seconds: float, poll: float = 0.02) -> None:
    """Checks ``condition()`` throughout ``seconds`` (first at once, last at the end) and fails the test at the
    first check it is false, naming ``what``. For negative checks: that nothing happened is only ever known for
    a period, so the period is stated here rather than hidden in a sleep before a single assertion."""
    started = time.monotonic()
    end = started + seconds
    while True:
        now = time.monotonic()
        assert condition(), _violated(what, now - started, seconds)
        if now >= end:
            return
        time.sleep(min(poll, end - now))


async def holds_for_async(condition: Callable[[], object], what: str, seconds: float, poll: float = 0.01) -> None:
    """``holds_for`` on an event loop: the code under test runs between checks."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    end = started + seconds
    while True:
        now = loop.time()
        assert condition(), _violated(what, now - started, seconds)
        if now >= end:
            return
        await asyncio.sleep(min(poll, end - now))
