"""The services a rollout worker depends on, and whether they answer.

A search or a Score call that fails because its service is down (it answers UNAVAILABLE: not running,
restarting, or a retriever missing a shard) is no fault of the prompt's: the worker hands the prompt back with no
delivery counted and takes no prompt, reporting itself not ready, until the service answers again. Whether it
does is asked every ``probe_seconds`` with a call of its own (an error other than UNAVAILABLE is an answer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from ragr1.services.common.errors import Unavailable
from ragr1.services.policy import metrics

log = logging.getLogger(__name__)

RETRIEVER, REWARD = "retriever", "reward"


class Dependencies:
    """``answering`` is set while every dependency answers. ``probes`` call each dependency by name;
    ``report_ready(False)`` when one goes down, ``(True)`` once all answer again (the server's health)."""

    def __init__(self, probes: Mapping[str, Callable[[], Awaitable[object]]], probe_seconds: float,
                 report_ready: Callable[[bool], Awaitable[None]] | None = None) -> None:
        self.probes = probes
        self.probe_seconds = probe_seconds
        self.report_ready = report_ready
        self.answering = asyncio.Event()
        self.answering.set()
        # The ones that did not answer, with why.
        self.down_now: dict[str, str] = {}
        self._probing: asyncio.Task[None] | None = None

    async def down(self, name: str, reason: str) -> None:
        """``name`` answered UNAVAILABLE: no prompt is taken until it answers again."""
        if name not in self.down_now:
            log.warning("the %s is down (%s): taking no prompt until it answers again", name, reason)
            metrics.WORKER_DEPENDENCY_DOWN.labels(name).set(1)
        self.down_now[name] = reason
        if self.answering.is_set():
            self.answering.clear()
            if self.report_ready is not None:
                await self.report_ready(False)
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe())

    async def answers(self, name: str) -> bool:
        try:
            await self.probes[name]()
        except Unavailable:
            return False
        except Exception:  # it answered, with an error of its own
            return True
        return True

    async def _probe(self) -> None:
        while self.down_now:
            await asyncio.sleep(self.probe_seconds)
            for name in list(self.down_now):
                if await self.answers(name):
                    log.info("the %s answers again: taking prompts", name)
                    metrics.WORKER_DEPENDENCY_DOWN.labels(name).set(0)
                    self.down_now.pop(name, None)
        self.answering.set()
        if self.report_ready is not None:
            await self.report_ready(True)

    def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
