"""Waiting in tests for something another process does."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], what: str, seconds: float = 120.0, poll: float = 0.2) -> None:
    """Returns once ``condition()`` is true; fails the test with ``what`` when ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(poll)
