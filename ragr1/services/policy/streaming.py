"""The rollout worker with the async loop: up to ``max_in_flight`` trajectories going, a prompt taken as soon as
its group fits.

Each prompt's group (its ``num_samples`` trajectories, each on its own: ``Policy.rollout`` with
``rollout_loop`` async) runs as its own task, and its rollouts are produced and its prompt acknowledged in
one Redis transaction when the group ends (``RolloutWorker._run``): a group never waits for another, and
the engine never waits for a batch's longest trajectory. Everything else is the lock-step worker's: the
follower's ``accepting`` gates taking, the lease on every prompt held is renewed, a failed group goes back at
once with a backoff (or is dead-lettered), and leaving stops taking, gives the groups in hand
``leave_seconds``, aborts the rest and hands every unacknowledged prompt back (a group taken and not started
included).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ragr1.services.common.config import Validated, check_at_least, setting
from ragr1.services.policy.worker import PromptDelivery, RolloutWorker, _either

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StreamingSettings(Validated):
    """How many trajectories the async rollout worker keeps going (the policy's config is one)."""

    # Enough to keep the engine's continuous batch full while some trajectories wait on the retriever, few
    # enough that a weight update (which waits for them under 'finish') and a leave (which hands back what
    # does not finish in the grace period) are not held up by a long queue.
    max_in_flight: int = setting(
        8, "rollout_loop async: trajectories a rollout worker keeps running at once (a group of num_samples "
        "starts when it fits; one larger than this runs alone)"
    )

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_in_flight", 1),))


class StreamingRolloutWorker(RolloutWorker):
    def __init__(self, *args: Any, max_in_flight: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_in_flight = max_in_flight
        # Each running group and its trajectories.
        self._groups: dict[asyncio.Task[None], int] = {}

    @property
    def in_flight(self) -> int:
        return sum(self._groups.values())

    def _fits(self, samples: int) -> bool:
        return not self._groups or self.in_flight + samples <= self.max_in_flight

    async def _steps(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        try:
            while not stop.is_set():
                if self.accepting is not None and not self.accepting.is_set():
                    await _either(self.accepting, stop)
                    continue
                if not self._fits(1):
                    await self._one_ends(stopped)
                    continue
                try:
                    await self._take_one(stop, stopped)
                except Exception:
                    log.exception("rollout worker step failed; retrying in 1 s")
                    await asyncio.sleep(1.0)
        finally:
            if self._groups:
                await self._finish(list(self._groups))

    async def _one_ends(self, stopped: asyncio.Future[Any]) -> None:
        await asyncio.wait([*self._groups, stopped], return_when=asyncio.FIRST_COMPLETED)

    async def _take_one(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        """Takes one prompt and starts its group once it fits; hands it back unstarted if the stop comes first."""
        deliveries = await self._take(1)
        for d in await self._valid(deliveries):
            samples = max(1, d.message.num_samples)
            while not stop.is_set() and not self._fits(samples):
                await self._one_ends(stopped)
            if stop.is_set():
                await self._hand_back([d])
                continue
            group = asyncio.create_task(self._group(d))
            self._groups[group] = samples
            group.add_done_callback(self._ended)

    def _ended(self, group: asyncio.Task[None]) -> None:
        self._groups.pop(group, None)

    async def _group(self, delivery: PromptDelivery) -> None:
        await self._run_safely([delivery])
