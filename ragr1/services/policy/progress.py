"""Liveness by progress: whether the rollouts of a held prompt still advance.

A rollout worker keeps its lease on a prompt only while the prompt's rollouts advance (a token generated, a
search or a score answered) within the stall limit (``WorkerSettings.stall_seconds``): a replica whose engine
hangs stops renewing and loses its prompts to the other replicas, as a dead one does. Each prompt's work runs
under its own ``Progress`` (``tracking``), which the engine and the agent loop stamp through ``advanced()``
wherever they are called from: they need not know which prompt they work for, since asyncio's tasks carry the
context they were started in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from ragr1.services.common.streams import Delivery


class Progress:
    """When some work last advanced (``clock``'s seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.at = clock()

    def advanced(self) -> None:
        self.at = self.clock()

    def idle_seconds(self) -> float:
        return self.clock() - self.at


_current: ContextVar[Progress | None] = ContextVar("ragr1_progress", default=None)


def advanced() -> None:
    """Stamps the progress of the work this runs for, if any."""
    progress = _current.get()
    if progress is not None:
        progress.advanced()


@contextlib.contextmanager
def tracking(progress: Progress) -> Iterator[Progress]:
    """Everything run inside, and in the tasks it starts, stamps ``progress``."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)


class Held:
    """The prompts a worker holds (taken, and not yet acknowledged, handed back or dead-lettered), by entry, each
    with the progress of its rollouts: the leases it renews."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._deliveries: dict[str, Delivery[Any]] = {}
        self._progress: dict[str, Progress] = {}
        self._started: set[str] = set()

    def add(self, deliveries: Sequence[Delivery[Any]]) -> None:
        for d in deliveries:
            self._deliveries[d.entry_id] = d
            self._progress[d.entry_id] = Progress(self.clock)

    def start(self, entry_ids: Sequence[str]) -> Progress:
        """The work on ``entry_ids`` (a group, or a lock-step chunk) starts: what it advances, it stamps."""
        shared = Progress(self.clock)
        for e in entry_ids:
            if e in self._deliveries:
                self._progress[e] = shared
                self._started.add(e)
        return shared

    def drop(self, entry_id: str) -> None:
        self._deliveries.pop(entry_id, None)
        self._progress.pop(entry_id, None)
        self._started.discard(entry_id)

    def clear(self) -> None:
        for e in list(self._deliveries):
            self.drop(e)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._deliveries

    def __len__(self) -> int:
        return len(self._deliveries)

    def leases(self, stall_seconds: float) -> tuple[list[str], list[str]]:
        """The entries whose lease is kept, and those let go: a started prompt's rollouts advanced within
        ``stall_seconds``; one not started yet (waiting for room) lives while the running ones advance."""
        now = self.clock()
        running = max((self._progress[e].at for e in self._started), default=None)
        kept: list[str] = []
        lapsed: list[str] = []
        for e, p in self._progress.items():
            at = p.at if e in self._started or running is None else max(p.at, running)
            (kept if now - at <= stall_seconds else lapsed).append(e)
        return kept, lapsed
