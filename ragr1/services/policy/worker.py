"""Rollout-worker mode: PromptTasks from the ``prompts`` stream in, scored Rollouts to ``rollouts`` out.

This is the lock-step loop's worker (``rollout_loop`` lockstep): it takes a batch and the next one when the batch
has finished. ``streaming.StreamingRolloutWorker`` (async, the default) builds on it and keeps trajectories going.

A batch's rollouts are produced to ``rollouts`` in the same Redis transaction that acknowledges
its prompts, so a crash loses nothing and duplicates nothing. A prompt whose rollout hit a
retriever error (or was aborted by a weight update) is not acknowledged: with ``requeue`` the
consumer group hands it out again after ``reclaim_idle_ms`` (to any worker; dead-lettered after
``max_deliveries``), with ``dead_letter`` it goes to ``prompts:dead`` at once with the error.

The worker takes prompts only while ``accepting`` is set (``follower.WeightFollower``: while the replica
serves the newest announced weights).

Leaving (SIGTERM: a scale-down, a rolling update) the worker takes no new prompt, lets the batch in hand
finish for up to ``leave_seconds``, then aborts what is left of it, and hands every prompt it has not
acknowledged back to the other workers, which take them at their next look rather than after
``reclaim_idle_ms``; its consumer leaves the group. A batch that fails (the engine's weights unknown after a
failed load, say) is handed back at once too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ragr1.services.common.errors import InvalidArgument
from ragr1.services.common.streams import Delivery, StreamQueue
from ragr1.services.policy import metrics
from ragr1.services.policy.agent import Sampling, Trajectory, TrajectoryStatus
from ragr1.services.policy.rollouts import Scorer, build_rollouts, expand, task_of
from ragr1.services.policy.runtime import Policy
from ragr1.v1 import common_pb2

log = logging.getLogger(__name__)

# What a leaving worker keeps of its grace period (at most: a quarter of it) to abort its batch and hand its
# prompts back: the abort and the batch's end after it get half of it each before the batch is cancelled
# outright (an engine that does not answer its abort), so that the hand-back always fits the grace period.
LEAVE_MARGIN_SECONDS = 5.0


def leave_margin(grace_seconds: float) -> float:
    return min(LEAVE_MARGIN_SECONDS, grace_seconds / 4)

PromptDelivery = Delivery[common_pb2.PromptTask]
# Statuses after which the prompt is tried again rather than handed to the trainer.
RETRY = {TrajectoryStatus.RETRIEVAL_ERROR: "retrieval_error", TrajectoryStatus.ABORTED: "aborted"}


class RolloutWorker:
    def __init__(
        self,
        policy: Policy,
        scorer: Scorer,
        prompts: StreamQueue[common_pb2.PromptTask],
        rollouts: StreamQueue[common_pb2.Rollout],
        sampling: Sampling,
        *,
        batch: int,
        block_ms: int,
        reclaim_idle_ms: int,
        dead_letter_retrieval_errors: bool,
        accepting: asyncio.Event | None = None,
        grace_seconds: float = 0.0,
    ) -> None:
        self.policy = policy
        self.scorer = scorer
        self.prompts = prompts
        self.rollouts = rollouts
        self.sampling = sampling
        self.batch = batch
        self.block_ms = block_ms
        self.reclaim_idle_ms = reclaim_idle_ms
        self.dead_letter_retrieval_errors = dead_letter_retrieval_errors
        self.accepting = accepting
        # Asked to stop, the batch in hand gets the grace period less what aborting it and handing back takes.
        self.margin = leave_margin(grace_seconds)
        self.leave_seconds = grace_seconds - self.margin
        # A worker restarted under the same consumer name (a stable one: see PolicyConfig.worker_name)
        # first takes back the prompts its predecessor was given and never acknowledged, at once
        # instead of after reclaim_idle_ms. Read once at start: prompts this worker fails later wait
        # for reclaim_idle_ms like any others.
        self._backlog: list[PromptDelivery] | None = None
        self._first_taken = False
        self._leaving = False

    async def _take(self, count: int) -> list[PromptDelivery]:
        if self._backlog is None:
            self._backlog = await asyncio.to_thread(
                self.prompts.consume, max(1000, 4 * self.batch), None, pending=True
            )
            if self._backlog:
                log.info("resuming %d prompts left pending under consumer %s",
                         len(self._backlog), self.prompts.consumer)
        if self._backlog:
            taken, self._backlog = self._backlog[:count], self._backlog[count:]
            return taken
        reclaimed = await asyncio.to_thread(self.prompts.reclaim, self.reclaim_idle_ms, count)
        if reclaimed:
            return reclaimed
        return await asyncio.to_thread(self.prompts.consume, count, self.block_ms)

    async def _say_first(self) -> None:
        """Logs which weights this replica's first prompts meet, with the time, so that an audit can hold them
        against the version announced in Redis at that moment (``make test-faults`` does)."""
        try:
            version, _, sha = await self.policy.served_checkpoint()
        except OSError as exc:
            log.warning("first prompts taken; the served weights cannot be read: %s", exc)
            return
        log.info("first prompts taken at %.3f serving v%d (sha256 %s)", time.time(), version, sha)

    def _dead_letter(self, delivery: PromptDelivery, reason: str) -> None:
        task = delivery.message
        self.prompts.dead_letter(delivery.entry_id, {"id": task.id, "data": task.SerializeToString()}, reason)
        metrics.WORKER_PROMPTS.labels("dead_lettered").inc()

    async def step(self) -> int:
        """Runs one batch; returns how many prompts it took (0 when the stream was empty)."""
        deliveries = await self._take(self.batch)
        if not deliveries:
            return 0
        if self._leaving:  # taken while the stop came: not started, so handed back whole
            await self._hand_back(deliveries)
            return 0
        for chunk in self._chunks(await self._valid(deliveries)):
            await self._run(chunk)
        return len(deliveries)

    async def _hand_back(self, deliveries: Sequence[PromptDelivery]) -> None:
        await asyncio.to_thread(self.prompts.hand_back, [d.entry_id for d in deliveries], leave=False)

    async def _valid(self, deliveries: Sequence[PromptDelivery]) -> list[PromptDelivery]:
        """The deliveries whose tasks the policy accepts; the others are dead-lettered with the reason."""
        if not self._first_taken:
            self._first_taken = True
            await self._say_first()
        valid: list[PromptDelivery] = []
        for d in deliveries:
            try:
                expand([d.message], self.policy.limits.max_batch)
                self.policy.prompt_ids([task_of(d.message)])
                valid.append(d)
            except InvalidArgument as exc:
                await asyncio.to_thread(self._dead_letter, d, f"invalid task: {exc}")
        return valid

    def _chunks(self, deliveries: Sequence[PromptDelivery]) -> list[list[PromptDelivery]]:
        """Consecutive groups whose samples fit one rollout batch (``max_batch``)."""
        chunks: list[list[PromptDelivery]] = []
        size = self.policy.limits.max_batch + 1
        for d in deliveries:
            samples = max(1, d.message.num_samples)
            if size + samples > self.policy.limits.max_batch:
                chunks.append([])
                size = 0
            chunks[-1].append(d)
            size += samples
        return chunks

    async def _run(self, deliveries: Sequence[PromptDelivery],
                   on_end: Callable[[Trajectory | None], None] | None = None) -> None:
        """``on_end``: called with each trajectory as it ends (the async loop's), before the batch is scored."""
        tasks = expand([d.message for d in deliveries], self.policy.limits.max_batch)
        try:
            trajectories = await self.policy.rollout([task_of(t) for t in tasks], self.sampling, on_end=on_end)
        except Exception:
            log.exception("rollout of %d prompts failed; they are handed back to the other workers", len(deliveries))
            metrics.WORKER_BATCHES.labels("failed").inc()
            await self._hand_back(deliveries)
            return
        failed: dict[str, str] = {}
        for task, t in zip(tasks, trajectories, strict=True):
            if t.status in RETRY:
                failed.setdefault(task.id, f"{RETRY[t.status]}: {t.error}")
        done = [d for d in deliveries if d.message.id not in failed]
        keep = [i for i, task in enumerate(tasks) if task.id not in failed]
        try:
            rollouts = await build_rollouts(
                [trajectories[i] for i in keep],
                [tasks[i] for i in keep],
                self.policy.tokenizer,
                self.scorer,
                self.sampling,
            )
        except Exception:
            log.exception("scoring failed; %d prompts will be handed out again", len(done))
            metrics.WORKER_BATCHES.labels("failed").inc()
            return

        def produce(pipe: Any) -> None:
            self.rollouts.produce(rollouts, pipe, producer=self.prompts.consumer)

        await asyncio.to_thread(self.prompts.ack, done, produce)
        metrics.WORKER_PROMPTS.labels("acked").inc(len(done))
        for d in deliveries:
            reason = failed.get(d.message.id)
            if reason is None:
                continue
            if self.dead_letter_retrieval_errors and reason.startswith("retrieval_error"):
                await asyncio.to_thread(self._dead_letter, d, reason)
            else:
                metrics.WORKER_PROMPTS.labels("requeued").inc()
        metrics.WORKER_BATCHES.labels("ok" if not failed else "partial").inc()

    async def run(self, stop: asyncio.Event) -> None:
        """Steps until ``stop`` is set, while ``accepting``; errors (Redis down) are logged and retried after a
        pause. Then leaves: see the module's docstring."""
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await self._steps(stop, stopped)
        finally:  # cut off or not, what it holds goes back
            stopped.cancel()
            await self._leave()

    async def _steps(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        while not stop.is_set():
            if self.accepting is not None and not self.accepting.is_set():
                await _either(self.accepting, stop)
                continue
            step = asyncio.ensure_future(self.step())
            await asyncio.wait([step, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                await self._finish([step])
            if step.cancelled():
                continue
            try:
                step.result()
            except Exception:
                log.exception("rollout worker step failed; retrying in 1 s")
                await asyncio.sleep(1.0)

    async def _finish(self, work: Sequence[asyncio.Future[Any]]) -> None:
        """The work in hand when the worker was asked to stop: ``leave_seconds`` to finish, then aborted (its
        rollouts come back ABORTED and are not acknowledged)."""
        self._leaving = True
        log.info("stopping: the rollouts in hand get %.1f s to finish", self.leave_seconds)
        _, pending = await asyncio.wait(work, timeout=self.leave_seconds)
        if pending:
            log.info("stopping: aborting the rollouts in hand; their prompts are handed back")
            aborting = asyncio.ensure_future(self.policy.abort_rollouts())
            await asyncio.wait([aborting], timeout=self.margin / 4)
            _, pending = await asyncio.wait(pending, timeout=self.margin / 4)
        # A call that does not end (a retriever past its deadline): its prompts go back all the same.
        for left in pending:
            left.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _leave(self) -> None:
        try:
            handed = await asyncio.to_thread(self.prompts.hand_back)
        except Exception as exc:  # Redis down: the prompts stay pending until another worker reclaims them
            log.warning("handing back the unfinished prompts failed (%s: %s); other workers take them after "
                        "reclaim_idle_ms", type(exc).__name__, exc)
            return
        metrics.WORKER_PROMPTS.labels("handed_back").inc(handed)
        log.info("left the prompts stream's group; %d unfinished prompts handed back", handed)


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Returns once either event is set."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
