"""Rollout-worker mode: PromptTasks from the ``prompts`` stream in, scored Rollouts to ``rollouts`` out.

This is the lock-step loop's worker (``rollout_loop`` lockstep): it takes a batch and the next one when the batch
has finished. ``streaming.StreamingRolloutWorker`` (async, the default) builds on it and keeps trajectories going.

A batch's rollouts are produced to ``rollouts`` in the same Redis transaction that acknowledges
its prompts, so a crash loses nothing and duplicates nothing.

Reclaim is for the dead only, and liveness is judged by progress: the worker keeps its lease on a prompt it holds
(``StreamQueue.renew``, a quarter of ``reclaim_idle_ms`` apart) while the prompt's rollouts advance (a token
generated, a search or a score answered: ``progress``) within ``stall_seconds``, so a group that runs longer than
``reclaim_idle_ms`` stays its own and one whose engine hangs does not; a prompt taken and waiting for room lives
as long as the replica's running rollouts advance. A prompt whose work failed for a passing reason goes back at
once with the failed delivery counted, to be taken again (by any worker) after a backoff that doubles with each
delivery (``retry_backoff_seconds`` up to ``retry_backoff_max_seconds``): a rollout that raised (weights unknown
after a failed load, say), a trajectory that ended with a retriever error or ABORTED (a weight update under
``on_weight_update: abort``), a scoring call that failed, an acknowledgement that failed. One that fails on its
``max_deliveries``-th delivery is dead-lettered with the failure. With ``on_retrieval_error: dead_letter`` a
retriever error dead-letters the prompt at once instead. A failure because a dependency is down (the retriever
or the reward service answered UNAVAILABLE) is no fault of the prompt's: it goes back with no delivery counted,
and the worker takes no prompt (and reports not ready) until the dependency answers again, asked every
``dependency_probe_seconds``; dead-lettering is for prompts that fail while their dependencies are healthy.

The worker takes prompts only while ``accepting`` is set (``follower.WeightFollower``: while the replica
serves the newest announced weights); a prompt taken and not started when it is cleared goes back. A worker
restarted under the same consumer name hands its predecessor's unacknowledged prompts back at its start (due at
once, no delivery counted), for whichever replica has room.

Leaving (SIGTERM: a scale-down, a rolling update) the worker takes no new prompt, lets the batch in hand
finish for up to ``leave_seconds``, then aborts what is left of it, and hands every prompt it has not
acknowledged back to the other workers, which take them at their next look rather than after
``reclaim_idle_ms``, with no delivery counted; its consumer leaves the group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ragr1.services.common.config import Validated, check_at_least, check_choice, same_as, setting
from ragr1.services.common.errors import InvalidArgument, Unavailable
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import MAX_BACKOFF_MS, Delivery, StreamQueue
from ragr1.services.policy import metrics, progress
from ragr1.services.policy.agent import Sampling, Trajectory, TrajectoryStatus
from ragr1.services.policy.dependencies import RETRIEVER, REWARD, Dependencies
from ragr1.services.policy.progress import Held
from ragr1.services.policy.rollouts import Scorer, build_rollouts, expand, task_of
from ragr1.services.policy.runtime import Policy
from ragr1.v1 import common_pb2

log = logging.getLogger(__name__)

# What a leaving worker keeps of its grace period (at most: a quarter of it) to abort its batch and hand its
# prompts back: the abort and the batch's end after it get half of it each before the batch is cancelled
# outright (an engine that does not answer its abort), so that the hand-back always fits the grace period.
LEAVE_MARGIN_SECONDS = 5.0


# Lease renewals per reclaim_idle_ms: a worker whose event loop misses three in a row still keeps its prompts.
LEASE_RENEWALS = 4


def leave_margin(grace_seconds: float) -> float:
    return min(LEAVE_MARGIN_SECONDS, grace_seconds / 4)


def backoff_seconds(deliveries: int, first: float, most: float) -> float:
    """How long a prompt that failed on its ``deliveries``-th delivery waits before it is handed out again: ``first``
    doubled with each delivery before it, at most ``most``."""
    return min(most, first * 2.0 ** min(max(0, deliveries - 1), 30))


RETRIEVAL_ERROR_ACTIONS = ("requeue", "dead_letter")


@dataclasses.dataclass
class WorkerSettings(Validated):
    """How a rollout worker takes, keeps and hands back prompts. The policy's config takes each of these
    definitions (``same_as``) and gives the worker this object whole (``PolicyConfig.worker_settings``)."""

    worker_batch: int = setting(8, "rollout_loop lockstep: tasks per rollout batch")
    worker_block_ms: int = setting(1000, "wait for new prompts up to this long per poll")
    reclaim_idle_ms: int = setting(600_000, "take over prompts another worker left unacknowledged this long")
    # Long enough that the max_deliveries a prompt has outlast a dependency's restart (5, 10, 20 and 40 s between
    # its five deliveries, plus their rollouts), short enough that the prompt is back well within the reclaim time.
    retry_backoff_seconds: float = setting(
        5.0, "a prompt whose work failed for a passing reason (a dependency restarting, an abort) goes back at once "
        "and is handed out again after this long, doubled with each delivery it has had"
    )
    retry_backoff_max_seconds: float = setting(120.0, "the longest backoff of a prompt handed back after a failure")
    on_retrieval_error: str = setting(
        "requeue", "prompts whose rollout hit a retriever error: requeue or dead_letter"
    )
    # Longer than any one engine step (a prefill of a full batch on a CPU included) and any search or score call
    # (their own deadlines), so that only a replica that has stopped working loses its prompts.
    stall_seconds: float = setting(
        120.0, "a held prompt's lease is renewed only while its rollouts advanced (a token generated, a search or a "
        "score answered) within this long; an engine with requests that makes no step for this long stops the "
        "replica (NOT_SERVING, its prompts handed back)"
    )
    dependency_probe_seconds: float = setting(
        5.0, "while the retriever or the reward service is down (UNAVAILABLE), the worker takes no prompt and asks "
        "it again this often"
    )
    # Asked to stop, the worker finishes or hands back what it holds within the server's grace period.
    grace_seconds: float = same_as(ServerConfig, "grace_seconds")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("worker_batch", 1), ("reclaim_idle_ms", 1)))
        for name in ("stall_seconds", "dependency_probe_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.retry_backoff_seconds <= self.retry_backoff_max_seconds <= MAX_BACKOFF_MS / 1000:
            raise ValueError(
                f"retry_backoff_seconds ({self.retry_backoff_seconds}) must be within 0..retry_backoff_max_seconds "
                f"({self.retry_backoff_max_seconds}), which must be at most {MAX_BACKOFF_MS // 1000}"
            )
        check_choice("on_retrieval_error", self.on_retrieval_error, RETRIEVAL_ERROR_ACTIONS)


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
        settings: WorkerSettings,
        *,
        accepting: asyncio.Event | None = None,
        report_ready: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        """``accepting``: set while the worker may take prompts (``follower.WeightFollower``'s); None: always.
        ``report_ready(False)`` while a dependency is down, ``(True)`` once it answers (the server's health)."""
        self.policy = policy
        self.scorer = scorer
        self.prompts = prompts
        self.rollouts = rollouts
        self.sampling = sampling
        self.settings = settings
        self.accepting = accepting
        self.dependencies = Dependencies(
            {RETRIEVER: lambda: policy.search.search(["are you there"], [0]), REWARD: lambda: scorer.score([])},
            settings.dependency_probe_seconds, report_ready,
        )
        # Asked to stop, the batch in hand gets the grace period less what aborting it and handing back takes.
        self.margin = leave_margin(settings.grace_seconds)
        self.leave_seconds = settings.grace_seconds - self.margin
        # A worker restarted under the same consumer name (a stable one: see PolicyConfig.worker_name) hands back
        # the prompts its predecessor was given and never acknowledged before it takes any.
        self._resumed = False
        self._first_taken = False
        self._leaving = False
        # A prompt it no longer holds by mistake is not renewed, so another worker reclaims it once idle
        # reclaim_idle_ms, as a dead worker's.
        self._held = Held()
        # Failed prompts whose hand-back failed (Redis down): handed back before anything else is taken.
        self._owed: list[tuple[list[PromptDelivery], str, str]] = []

    async def _take(self, count: int) -> list[PromptDelivery]:
        await self._settle_owed()
        taken = await self._take_from_redis(count)
        self._held.add(taken)
        return taken

    async def _take_from_redis(self, count: int) -> list[PromptDelivery]:
        if not self._resumed:
            # Not held in bulk (a restarted consumer's backlog can be hundreds): each goes to whichever replica
            # has room, this one included, its delivery count as it was.
            handed = await asyncio.to_thread(self.prompts.hand_back, None, leave=False)
            self._resumed = True
            if handed:
                log.info("handed back %d prompts left pending under consumer %s", handed, self.prompts.consumer)
        reclaimed = await asyncio.to_thread(self.prompts.reclaim, self.settings.reclaim_idle_ms, count)
        if reclaimed:
            return reclaimed
        return await asyncio.to_thread(self.prompts.consume, count, self.settings.worker_block_ms)

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
        self._held.drop(delivery.entry_id)
        metrics.WORKER_PROMPTS.labels("dead_lettered").inc()

    async def _retry(self, deliveries: Sequence[PromptDelivery], reason: str, kind: str) -> None:
        """Hands back prompts whose work failed for a passing reason (``kind``: rollout, scoring,
        acknowledgement, retrieval_error, aborted), at once, with the failed delivery counted and a backoff;
        dead-letters one that has failed on its ``max_deliveries``-th delivery. When Redis cannot be reached, they
        are owed: handed back before the next prompt is taken, and kept (renewed) meanwhile."""
        if not deliveries:
            return
        try:
            spent = [d for d in deliveries if d.deliveries >= self.prompts.max_deliveries]
            for d in spent:
                await asyncio.to_thread(self._dead_letter, d, f"{reason} (delivery {d.deliveries}, max_deliveries "
                                                              f"{self.prompts.max_deliveries})")
            by_count: dict[int, list[PromptDelivery]] = {}
            for d in deliveries:
                if d not in spent:
                    by_count.setdefault(d.deliveries, []).append(d)
            for count, group in by_count.items():
                wait = backoff_seconds(count, self.settings.retry_backoff_seconds,
                                       self.settings.retry_backoff_max_seconds)
                await asyncio.to_thread(self.prompts.retry, [d.entry_id for d in group], round(wait * 1000))
                for d in group:
                    self._held.drop(d.entry_id)
                metrics.WORKER_PROMPTS.labels("requeued").inc(len(group))
                metrics.WORKER_REQUEUES.labels(kind).inc(len(group))
                log.info("prompts %s handed back after their failed delivery %d (%s: %s); due again in %.1f s",
                         ", ".join(d.message.id for d in group), count, kind, reason, wait)
        except Exception as exc:
            left = [d for d in deliveries if d.entry_id in self._held]
            log.warning("handing back %d failed prompts failed (%s: %s); again before the next prompt is taken",
                        len(left), type(exc).__name__, exc)
            if left:
                self._owed.append((left, reason, kind))

    async def _settle_owed(self) -> None:
        """Hands back what failed while Redis could not be reached; raises while it still cannot."""
        owed, self._owed = self._owed, []
        for deliveries, reason, kind in owed:
            await self._retry(deliveries, reason, kind)
        if self._owed:
            raise ConnectionError(f"{sum(len(d) for d, _, _ in self._owed)} failed prompts are still to be handed "
                                  "back")

    async def _keep_lease(self) -> None:
        """Renews this worker's lease on the prompts it holds whose rollouts advance (``Held.leases``),
        ``LEASE_RENEWALS`` times per ``reclaim_idle_ms``; hands back what a Redis outage left owed, whether or not
        the worker takes prompts meanwhile."""
        every = self.settings.reclaim_idle_ms / 1000 / LEASE_RENEWALS
        lapsed: set[str] = set()
        while True:
            await asyncio.sleep(every)
            if self._owed:
                try:
                    await self._settle_owed()
                except ConnectionError as exc:
                    log.warning("%s", exc)
            kept, stalled = self._held.leases(self.settings.stall_seconds)
            new = [e for e in stalled if e not in lapsed]
            if new:
                log.warning("%d held prompts made no progress for %g s (stall_seconds): their lease lapses, and "
                            "another replica takes them after reclaim_idle_ms", len(new), self.settings.stall_seconds)
                metrics.WORKER_LEASES_LAPSED.inc(len(new))
            lapsed = set(stalled)
            if not kept:
                continue
            try:
                await asyncio.to_thread(self.prompts.renew, kept)
            except Exception as exc:  # Redis down: tried again at the next renewal
                log.warning("renewing the lease on %d prompts failed: %s: %s", len(kept), type(exc).__name__, exc)

    async def _may_take(self, stop: asyncio.Event) -> bool:
        """Whether the worker may take a prompt now; when it may not, waits until that may have changed."""
        for gate in (self.accepting, self.dependencies.answering):
            if gate is not None and not gate.is_set():
                await _either(gate, stop)
                return False
        return True

    async def step(self) -> int:
        """Runs one batch; returns how many prompts it took (0 when the stream was empty)."""
        deliveries = await self._take(self.settings.worker_batch)
        if not deliveries:
            return 0
        if self._leaving:  # taken while the stop came: not started, so handed back whole
            await self._hand_back(deliveries)
            return 0
        for chunk in self._chunks(await self._valid(deliveries)):
            with progress.tracking(self._held.start([d.entry_id for d in chunk])):
                await self._run_safely(chunk)
        return len(deliveries)

    async def _run_safely(self, deliveries: Sequence[PromptDelivery],
                          on_end: Callable[[Trajectory | None], None] | None = None) -> None:
        """``_run``, and whatever of its prompts it left held when it raised (a fault of its own) handed back to
        be tried again: a prompt held and not worked on would keep its lease for good."""
        try:
            await self._run(deliveries, on_end)
        except Exception as exc:
            log.exception("the work on %d prompts failed", len(deliveries))
            await self._retry([d for d in deliveries if d.entry_id in self._held],
                              f"rollout worker error: {type(exc).__name__}: {exc}", "rollout")

    async def _hand_back(self, deliveries: Sequence[PromptDelivery]) -> None:
        """Back to the other workers at once, no delivery counted: work this worker did not do, or that failed
        through no fault of the prompt's."""
        if not deliveries:
            return
        await asyncio.to_thread(self.prompts.hand_back, [d.entry_id for d in deliveries], leave=False)
        for d in deliveries:
            self._held.drop(d.entry_id)
        metrics.WORKER_PROMPTS.labels("handed_back").inc(len(deliveries))

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
        except Exception as exc:
            log.exception("rollout of %d prompts failed; they are handed back to be tried again", len(deliveries))
            metrics.WORKER_BATCHES.labels("failed").inc()
            await self._retry(deliveries, f"rollout failed: {type(exc).__name__}: {exc}", "rollout")
            return
        failed: dict[str, tuple[str, str]] = {}
        down: set[str] = set()
        for task, t in zip(tasks, trajectories, strict=True):
            if t.status in RETRY:
                failed.setdefault(task.id, (RETRY[t.status], f"{RETRY[t.status]}: {t.error}"))
                if t.retriever_down:
                    down.add(task.id)
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
        except Unavailable as exc:
            await self._hand_back(done)
            await self.dependencies.down(REWARD, str(exc))
            done = []
        except Exception as exc:
            log.exception("scoring failed; %d prompts are handed back to be tried again", len(done))
            await self._retry(done, f"scoring failed: {type(exc).__name__}: {exc}", "scoring")
            done = []
        else:
            progress.advanced()
            def produce(pipe: Any) -> None:
                self.rollouts.produce(rollouts, pipe, producer=self.prompts.consumer)

            try:
                await asyncio.to_thread(self.prompts.ack, done, produce)
            except Exception as exc:
                log.exception("acknowledging %d prompts failed; they are handed back to be tried again", len(done))
                await self._retry(done, f"acknowledgement failed: {type(exc).__name__}: {exc}", "acknowledgement")
                done = []
            else:
                for d in done:
                    self._held.drop(d.entry_id)
                metrics.WORKER_PROMPTS.labels("acked").inc(len(done))
        for d in deliveries:
            if d.message.id not in failed:
                continue
            kind, reason = failed[d.message.id]
            if d.message.id in down:
                await self._hand_back([d])
                await self.dependencies.down(RETRIEVER, reason)
            elif self.settings.on_retrieval_error == "dead_letter" and kind == "retrieval_error":
                await asyncio.to_thread(self._dead_letter, d, reason)
            elif not (self._leaving and kind == "aborted"):  # aborted by the leave: handed back whole, uncounted
                await self._retry([d], reason, kind)
        metrics.WORKER_BATCHES.labels("ok" if len(done) == len(deliveries) else "partial" if done else "failed").inc()

    async def run(self, stop: asyncio.Event) -> None:
        """Steps until ``stop`` is set, while ``accepting``; errors (Redis down) are logged and retried after a
        pause. Then leaves: see the module's docstring."""
        stopped = asyncio.ensure_future(stop.wait())
        lease = asyncio.ensure_future(self._keep_lease())
        try:
            await self._steps(stop, stopped)
        finally:  # cut off or not, what it holds goes back
            stopped.cancel()
            try:
                await self._leave()
            finally:
                lease.cancel()
                self.dependencies.close()

    async def _steps(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        while not stop.is_set():
            if not await self._may_take(stop):
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
        self._held.clear()
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
