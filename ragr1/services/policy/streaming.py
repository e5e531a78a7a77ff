"""The rollout worker with the async loop: as many trajectories going as its engine batches (or up to an explicit
``max_in_flight``), a prompt taken as soon as its group fits.

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
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ragr1.services.common.config import Validated, check_at_least, setting
from ragr1.services.common.streams import StreamQueue
from ragr1.services.policy import metrics, progress
from ragr1.services.policy.agent import Sampling, Trajectory
from ragr1.services.policy.rollouts import Scorer
from ragr1.services.policy.runtime import Policy
from ragr1.services.policy.worker import PromptDelivery, RolloutWorker, WorkerSettings
from ragr1.v1 import common_pb2

log = logging.getLogger(__name__)

# How often a prompt waiting for room looks whether it may still start (the follower's gate has no event for
# being cleared).
_LOOK_SECONDS = 1.0


@dataclasses.dataclass
class StreamingSettings(Validated):
    """How many trajectories the async rollout worker keeps going (the policy's config is one)."""

    # 0 follows the engine: vLLM batches max_num_seqs sequences (fewer when its KV cache holds fewer
    # trajectories), and a worker that keeps fewer going leaves the rest of that batch, which the GPU computes
    # anyway, empty. An explicit number is a hard cap, for a replica whose weight updates (which wait for the
    # running trajectories under 'finish') or leaves (which hand back what does not finish in the grace period)
    # must stay short.
    max_in_flight: int = setting(
        0, "rollout_loop async: trajectories a rollout worker keeps running at once; 0: as many as its engine "
        "runs at once (max_num_seqs, or the trajectories its KV cache holds at the length they reach when fewer) "
        "besides those waiting on a search, a group of num_samples starting while fewer run, twice that at most; "
        "N: at most N (a group starts when it fits; one larger runs alone)"
    )

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_in_flight", 0),))


Batch = TypeVar("Batch", int, "EngineBatch")


def resolve_max_in_flight(max_in_flight: int, engine_batch: Batch) -> int | Batch:
    """The one rule of ``max_in_flight`` (the chart's ``maxInFlight``), which the worker, the local stack and the
    scale rig all follow: 0 follows the engine's batch (``engine_batch``: how many it runs at once, or the
    ``EngineBatch`` that keeps counting it), any other number caps the trajectories running at that."""
    if max_in_flight:
        return max_in_flight
    return max(1, engine_batch) if isinstance(engine_batch, int) else engine_batch


# How many of the trajectories that ended last give the length by which the engine's batch is counted.
LENGTH_WINDOW = 256


class EngineBatch:
    """How many trajectories an engine runs at once: ``sequences_at_once(tokens)`` (the engine's: its
    ``max_num_seqs``, or as many of that length as its KV cache holds when fewer). The length is at first the
    longest a trajectory may reach (``longest``), then the mean final length of the last ``window`` that ended:
    vLLM admits a request by the cache its context takes now, and the trajectories of a batch are at every stage
    of theirs, so the worst case would leave most of the cache, and of the batch, unused."""

    def __init__(self, sequences_at_once: Callable[[int], int], longest: int, window: int) -> None:
        self._at_once = sequences_at_once
        self.longest = longest
        self._lengths: deque[int] = deque(maxlen=window)
        self._total = 0
        self.size = sequences_at_once(longest)

    def ended(self, tokens: int) -> None:
        """A trajectory ended holding ``tokens`` (prompt and response)."""
        if len(self._lengths) == self._lengths.maxlen:
            self._total -= self._lengths[0]
        self._lengths.append(tokens)
        self._total += tokens
        self.size = self._at_once(min(self.longest, max(1, -(-self._total // len(self._lengths)))))


class StreamingRolloutWorker(RolloutWorker):
    """``max_in_flight``, of the trajectories running (``resolve_max_in_flight``'s: ``server.build_worker``): a
    number is a hard cap on running trajectories (a group starts only when all its samples
    fit); an ``EngineBatch`` is the engine's batch kept full (a group starts while fewer than it run, not counting
    those waiting on a search, up to twice the batch in all). Running trajectories are those started and not
    ended: the finished samples of a group waiting for its last one free their place at once."""

    def __init__(
        self,
        policy: Policy,
        scorer: Scorer,
        prompts: StreamQueue[common_pb2.PromptTask],
        rollouts: StreamQueue[common_pb2.Rollout],
        sampling: Sampling,
        settings: WorkerSettings,
        *,
        accepting: asyncio.Event | None = None,
        report_ready: Callable[[bool], Awaitable[None]] | None = None,
        max_in_flight: int | EngineBatch,
    ) -> None:
        super().__init__(policy, scorer, prompts, rollouts, sampling, settings, accepting=accepting,
                         report_ready=report_ready)
        self._max_in_flight = max_in_flight
        # Each running group and how many of its trajectories still run; their sum, kept as it changes.
        self._groups: dict[asyncio.Task[None], int] = {}
        self._running = 0
        # Set whenever a trajectory or a group ends, or trajectories start waiting on a search: room may have come
        # free.
        self._freed = asyncio.Event()
        if isinstance(self._max_in_flight, EngineBatch):
            self.policy.loop.on_search = self._freed.set

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight if isinstance(self._max_in_flight, int) else self._max_in_flight.size

    @property
    def in_flight(self) -> int:
        return self._running

    def _fits(self, samples: int) -> bool:
        if not self._groups:
            return True
        if isinstance(self._max_in_flight, int):
            return self._running + samples <= self._max_in_flight
        # Kept full: the trajectories waiting on a search hold no place in the engine's batch meanwhile, so others
        # start in theirs; never more than twice the batch in all, so that a retriever that stalls does not
        # make the worker take prompts without end.
        batch = self._max_in_flight.size
        searching = min(self._running, self.policy.loop.searching)
        return self._running - searching < batch and self._running < 2 * batch

    async def _steps(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        try:
            while not stop.is_set():
                if not await self._may_take(stop):
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

    async def _one_ends(self, stopped: asyncio.Future[Any], timeout: float | None = None) -> None:
        """Waits until a trajectory or a group ends (or the stop), at most ``timeout``."""
        self._freed.clear()
        freed = asyncio.ensure_future(self._freed.wait())
        try:
            await asyncio.wait([freed, stopped], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            freed.cancel()

    def _startable(self) -> bool:
        """Whether a prompt taken may still start: the replica accepts, and its dependencies answer."""
        return (self.accepting is None or self.accepting.is_set()) and self.dependencies.answering.is_set()

    async def _take_one(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        """Takes one prompt and starts its group once it fits; hands it back unstarted if the stop comes first, or if
        the replica stops accepting (a new version to load, refused weights) or a dependency goes down meanwhile:
        another replica may start it at once."""
        deliveries = await self._take(1)
        for d in await self._valid(deliveries):
            samples = max(1, d.message.num_samples)
            while not stop.is_set() and self._startable() and not self._fits(samples):
                await self._one_ends(stopped, timeout=_LOOK_SECONDS)
            if stop.is_set() or not self._startable():
                await self._hand_back([d])
                continue
            group = asyncio.create_task(self._group(d))
            self._groups[group] = samples
            self._running += samples
            group.add_done_callback(self._ended)

    def _trajectory_ended(self, group: asyncio.Task[None] | None, trajectory: Trajectory | None) -> None:
        if group is not None and self._groups.get(group, 0) > 0:
            self._groups[group] -= 1
            self._running -= 1
            self._freed.set()
        if trajectory is not None and isinstance(self._max_in_flight, EngineBatch):
            size = self._max_in_flight.size
            self._max_in_flight.ended(trajectory.length)
            if self._max_in_flight.size != size:
                metrics.WORKER_MAX_IN_FLIGHT.set(self._max_in_flight.size)

    def _ended(self, group: asyncio.Task[None]) -> None:
        self._running -= self._groups.pop(group, 0)
        self._freed.set()

    async def _group(self, delivery: PromptDelivery) -> None:
        group = asyncio.current_task()
        with progress.tracking(self._held.start([delivery.entry_id])):
            await self._run_safely([delivery], on_end=lambda trajectory: self._trajectory_ended(group, trajectory))
