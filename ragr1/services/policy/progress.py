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
from collections.abc import Callable, Iterator
from contextvars import ContextVar


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
