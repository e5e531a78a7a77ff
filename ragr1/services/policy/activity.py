"""What the policy's gauges measure when many rollouts run at once (the async worker keeps several groups going):
wall time during which at least one of some overlapping activities runs, counted once however many do, and
growth over a recent window. Per-call figures divided a group's tokens by its own time, which under-reported a
replica's rate by the number of groups running, and summed retrieval waits that overlapped."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable


class Busy:
    """Wall seconds during which at least one activity ran (``begin``/``end`` around each); ``on_time`` gets
    every increment as it is counted (a Prometheus counter's ``inc``)."""

    def __init__(self, on_time: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.on_time = on_time
        self.clock = clock
        self.running = 0
        self.total = 0.0
        self._last = clock()

    def _advance(self) -> None:
        now = self.clock()
        if self.running:
            elapsed = max(0.0, now - self._last)
            self.total += elapsed
            if self.on_time is not None and elapsed:
                self.on_time(elapsed)
        self._last = now

    def begin(self) -> None:
        self._advance()
        self.running += 1

    def end(self) -> None:
        self._advance()
        self.running = max(0, self.running - 1)

    def seconds(self) -> float:
        """The busy seconds so far, the stretch running now included."""
        self._advance()
        return self.total


class Window:
    """Growth of cumulative totals over the last ``seconds``: each ``growth`` call records the totals and returns
    how much each grew since the oldest record not older than that."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._records: collections.deque[tuple[float, tuple[float, ...]]] = collections.deque()

    def growth(self, *totals: float) -> tuple[float, ...]:
        now = self.clock()
        while self._records and self._records[0][0] < now - self.seconds:
            self._records.popleft()
        self._records.append((now, totals))
        first = self._records[0][1]
        return tuple(t - f for t, f in zip(totals, first, strict=True))
