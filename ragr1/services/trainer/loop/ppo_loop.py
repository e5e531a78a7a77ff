"""The loop itself: resume from the latest checkpoint, collect a batch, update, checkpoint, acknowledge,
announce; the guarantees it keeps are in the package's docstring (``ragr1.services.trainer.loop``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import redis

from ragr1.model_paths import policy_checkpoint
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, Delivery, StreamQueue
from ragr1.services.trainer import metrics
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.health import HealthMonitor
from ragr1.services.trainer.loop import gauges
from ragr1.services.trainer.loop.admission import Admission
from ragr1.services.trainer.loop.groups import GroupBuffer
from ragr1.services.trainer.loop.record import CURVES, step_record
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import Sample
from ragr1.v1 import common_pb2

# The loop's parts log under the name the loop had as one module, which log filters select.
log = logging.getLogger(__package__)


class NoSignal(RuntimeError):
    """Dynamic sampling reached its bound without one group whose samples scored differently."""


class Updater(Protocol):
    def update(self, samples: Sequence[Sample]) -> dict[str, float]: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def save_policy(self, directory: Path) -> None: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """``publisher.WeightPublisher``: versions announced to the replicas, and the fleet watched."""

    def publish(self, version: int, checkpoint: Path, sha256: str) -> dict[str, object]: ...

    def resume(self, version: int, checkpoint: Path, sha256: str) -> None: ...

    def in_use(self) -> set[int]: ...

    def watch(self) -> Any: ...


@dataclasses.dataclass
class TrainerStatus:
    """What ``Trainer.Status`` reports; the loop updates it, the servicer reads it."""

    stage: str = "idle"
    step: int = 0
    policy_version: int = 0
    rollouts_trained: int = 0
    rollouts_dropped_stale: int = 0
    last_mean_reward: float = 0.0
    checkpoint_path: str = ""
    last_logprob_gap: float = 0.0
    weight_sync_alarms: int = 0


def check_rollout(rollout: common_pb2.Rollout, current_version: int) -> str | None:
    """Why a rollout cannot be trained on, or None."""
    n = len(rollout.response_token_ids)
    if not rollout.prompt_token_ids or n == 0:
        return "rollout has an empty prompt or response"
    if len(rollout.loss_mask) != n or len(rollout.behaviour_logprobs) != n:
        return (
            f"lengths disagree: {n} response tokens, {len(rollout.loss_mask)} loss-mask entries, "
            f"{len(rollout.behaviour_logprobs)} behaviour logprobs"
        )
    if rollout.policy_version > current_version:
        return f"policy_version {rollout.policy_version} is from the future (trainer is at {current_version})"
    if not rollout.HasField("sampling"):
        return "rollout has no sampling settings (Rollout.sampling): the distribution it came from is unknown"
    if rollout.sampling.temperature <= 0:
        return (
            f"sampled greedily (temperature {rollout.sampling.temperature:g}): "
            "no behaviour distribution to train on"
        )
    return None


def to_sample(rollout: common_pb2.Rollout, weights_lag: int | None = None) -> Sample:
    """``weights_lag``: the trainer's version minus the rollout's (see ``Sample.weights_lag``)."""
    return Sample(
        id=rollout.id,
        sequence=TokenSequence(
            list(rollout.prompt_token_ids),
            list(rollout.response_token_ids),
            [int(m) for m in rollout.loss_mask],
        ),
        score=rollout.reward.total,
        group_id=rollout.group_id or rollout.task_id,
        behaviour_logprobs=list(rollout.behaviour_logprobs),
        temperature=rollout.sampling.temperature,
        weights_lag=weights_lag,
    )


class PPOLoop:
    """Composes the loop's parts: ``admission`` (prompts in, rollouts settled, counted in Redis), ``groups``
    (the rollouts waiting for a batch), ``record`` (each update's step record) and ``gauges`` (its metrics
    and alarms)."""

    def __init__(
        self,
        config: PPOConfig,
        client: redis.Redis,
        tasks: Sequence[common_pb2.PromptTask],
        updater: Updater,
        checkpoints: Checkpointer,
        steps: StepLog,
        publisher: Publisher | None = None,
        status: TrainerStatus | None = None,
    ) -> None:
        self.config = config
        self.redis = client
        self.updater = updater
        self.checkpoints = checkpoints
        self.steps = steps
        self.publisher = publisher
        self.status = status or TrainerStatus()
        self.version = config.start_version
        self.trained: set[str] = set()
        self.trained_order: list[str] = []
        self.stop_event = threading.Event()
        # Annotated Any: mypy does not match the protobuf stubs' ``id`` with the Payload protocol.
        self.prompts: StreamQueue[Any] = StreamQueue(client, PROMPTS, common_pb2.PromptTask, group=config.group)
        self.rollouts: StreamQueue[Any] = StreamQueue(
            client,
            ROLLOUTS,
            common_pb2.Rollout,
            group=config.group,
            consumer=config.consumer,
            validate=self._validate,
        )
        self.workers: StreamQueue[Any] = StreamQueue(client, PROMPTS, common_pb2.PromptTask,
                                                     group=config.worker_group)
        self.admission = Admission(config, client, self.prompts, self.rollouts, tasks)
        self.groups = GroupBuffer(config, self.admission.settle)
        self._warned_top_p = False
        self._queue_seconds = 0.0
        self._watched_at = -math.inf
        self.health = HealthMonitor(config)
        self.health.export_metrics()

    # -- state ----------------------------------------------------------------------------------
    def resume(self) -> None:
        """Loads the latest checkpoint (weights, optimiser, trained ids), if any."""
        latest = self.checkpoints.latest()
        if latest is None:
            if self.publisher is not None:
                # The starting weights go through the announcement like every later version: a replica whose
                # own model is another (an SFT checkpoint to train from) loads them before its first prompt.
                start = policy_checkpoint(self.config.model)
                log.info("announcing the starting weights %s as v%d", start, self.version)
                self.publisher.resume(self.version, start, checkpoint_sha256(start))
            return
        path, meta = latest
        state = self.checkpoints.load_state(path)
        if state is not None:
            self.updater.load_state(state)
        self.version = int(meta["version"])
        self.trained_order = list(meta.get("trained_ids", []))
        self.trained = set(self.trained_order)
        self.status.step = int(meta.get("step", self.version))
        self.status.policy_version = self.version
        self.status.rollouts_trained = len(self.trained)
        self.status.checkpoint_path = str(policy_dir(path))
        metrics.POLICY_VERSION.set(self.version)
        log.info("resumed from %s: version %d, %d rollouts trained", path, self.version, len(self.trained))
        if self.publisher is not None:
            # The trainer may have died between saving this version and announcing it.
            self.publisher.resume(self.version, policy_dir(path), self.checkpoints.policy_sha256(path))

    # -- rollouts -------------------------------------------------------------------------------
    def _validate(self, rollout: common_pb2.Rollout) -> str | None:
        reason = check_rollout(rollout, self.version)
        if reason is not None:
            self.groups.reject(rollout)
        elif 0 < rollout.sampling.top_p < 1 and not self._warned_top_p:
            self._warned_top_p = True
            log.warning(
                "rollouts sampled with top_p %g: the trainer's log-probs cover the whole vocabulary, so the "
                "importance weights are approximate (sample with top_p 1 for exact ones)",
                rollout.sampling.top_p,
            )
        return reason

    def _admit(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """Sorts fresh deliveries into the buffer; settles what was trained already, then drops groups."""
        self.groups.admit(deliveries, self.trained)
        self._drop_groups()

    def _drop_groups(self) -> None:
        self.status.rollouts_dropped_stale += self.groups.drop(self.version)

    def collect(self) -> bool:
        """Feeds prompts and reads rollouts until a batch of whole groups is buffered; returns whether one is
        (False: a stop was asked for). With dynamic sampling, a batch of groups whose members scored
        differently; once the update has skipped ``max_uniform_groups`` uniform groups, the ones it holds, however
        few; none at all stops training with ``NoSignal``."""
        c = self.config
        self._drop_groups()
        while not self.stop_event.is_set():
            if self.groups.ready() >= c.batch_size:
                return True
            if self.groups.exhausted():
                if self.groups.ready():
                    return True
                raise NoSignal(
                    f"dynamic sampling: all {len(self.groups.skipped)} groups sampled for update {self.version + 1} "
                    f"scored alike (every sample of a prompt the same total reward), so none has an advantage to "
                    f"train on: the prompts are too hard (or too easy) for this policy. Give prompts it answers "
                    f"sometimes, a denser reward, more samples_per_prompt or a larger max_uniform_groups "
                    f"(now {c.max_uniform_groups}); DAPO stops at its bound too"
                )
            start = time.perf_counter()
            self.admission.feed(self.version)
            wanted = max(c.samples_per_prompt, c.batch_size - self.groups.ready())
            fresh = self.rollouts.consume(wanted, block_ms=c.poll_ms)
            self._admit(fresh)
            self.groups.skip_uniform()
            self._watch()
            self._queue_seconds += time.perf_counter() - start
            metrics.QUEUE_DEPTH.labels(PROMPTS).set(self.prompts.depth())
            metrics.QUEUE_DEPTH.labels(ROLLOUTS).set(self.rollouts.pending())
        return False

    def _watch(self) -> None:
        """Every ``fleet_poll_seconds``: the replicas' reports read, exported and checked (``Publisher.watch``
        raises when they do not follow)."""
        if self.publisher is None or time.monotonic() - self._watched_at < self.config.fleet_poll_seconds:
            return
        self._watched_at = time.monotonic()
        self.publisher.watch()

    # -- one update -----------------------------------------------------------------------------
    def train_batch(self) -> dict[str, Any]:
        batch = self.groups.take_batch()
        rollouts = [d.message for d in batch]
        staleness = [self.version - r.policy_version for r in rollouts]
        gauges.observe_staleness(staleness)
        stats = self.updater.update([to_sample(r, lag) for r, lag in zip(rollouts, staleness, strict=True)])
        ids = [r.id for r in rollouts]
        new_version = self.version + 1
        meta = {
            "stage": "ppo",
            "step": new_version,
            "trained_ids": self.trained_order + ids,
            "time": time.time(),
        }
        saving = time.perf_counter()
        # A version a replica still serves or loads is not pruned from under it.
        in_use = self.publisher.in_use() if self.publisher is not None else set()
        path = self.checkpoints.save(new_version, meta, self.updater.save_policy, self.updater.state(),
                                     in_use=in_use)
        save_seconds = time.perf_counter() - saving
        served = policy_dir(path)
        start = time.perf_counter()
        self.admission.settle(batch)
        self._queue_seconds += time.perf_counter() - start
        self.version = new_version
        self.trained.update(ids)
        self.trained_order += ids
        announced = (self.publisher.publish(new_version, served, self.checkpoints.policy_sha256(path))
                     if self.publisher is not None else {})
        gauges.observe_ages([d.entry_id for d in batch], time.time())
        record = step_record(
            new_version,
            rollouts,
            stats,
            groups=[self.groups.group(r) for r in rollouts] if self.config.samples_per_prompt > 1 else None,
            staleness=staleness,
            skipped=self.groups.skipped,
            skipped_types=self.groups.skipped_types,
            queue_seconds=self._queue_seconds,
            checkpoint=served,
            save_seconds=save_seconds,
            announced=announced,
        )
        fired = self.health.check(record)
        record["alarms"] = [f.alarm.name for f in fired]
        record["weight_sync_alarm"] = "weight_sync" in record["alarms"]
        if self.config.trim_streams:
            record["trimmed"] = self.rollouts.trim() + self.prompts.trim()
        self._queue_seconds = 0.0
        self.groups.new_update()
        self.steps.write(record)
        gauges.export(record)
        self._update_status(record, served)
        gauges.report(fired, record)
        self.status.weight_sync_alarms += sum(f.alarm.name == "weight_sync" for f in fired)
        return record

    def _update_status(self, record: dict[str, Any], path: Path) -> None:
        st = self.status
        if "logprob_gap" in record:
            st.last_logprob_gap = record["logprob_gap"]
        st.step, st.policy_version = self.version, self.version
        st.rollouts_trained = len(self.trained)
        st.last_mean_reward = record["reward_total"]
        st.checkpoint_path = str(path)

    def run(self) -> int:
        """Resumes, then trains until ``max_updates`` updates past ``start_version`` (0 = until stopped);
        returns the version."""
        self.rollouts.ensure_group()
        self.prompts.ensure_group()
        # The workers' group too, before any worker exists: the autoscaler's backlog is the group's, and a
        # fleet scaled to zero must see the first prompt as waiting work.
        self.workers.ensure_group()
        self.resume()
        # This consumer's delivered-but-unacknowledged entries: the batch a crash interrupted; then those of
        # a predecessor under another name (one trainer per group, so whoever else holds entries is gone).
        self._admit(self.rollouts.consume(max(1000, 4 * self.config.batch_size), pending=True))
        self._admit(self.rollouts.take_over())
        self.status.stage = "ppo"
        self.status.policy_version = self.version
        updates = self.config.max_updates
        limit = self.config.start_version + updates
        while not self.stop_event.is_set() and (updates <= 0 or self.version < limit):
            if self.collect():
                record = self.train_batch()
                log.info(
                    "update %d: reward %.3f, entropy %.3f, likelihood change %s, clip fraction %.3f, log-prob gap "
                    "%s, %.0f tokens/s; weights %.1f MB saved and hashed in %.1f s",
                    record["version"],
                    record["reward_total"],
                    record.get("entropy", 0.0),
                    f"{record['likelihood_change']:+.4f}" if "likelihood_change" in record else "n/a",
                    record.get("clip_fraction", 0.0),
                    f"{record['logprob_gap']:.4f}" if "logprob_gap" in record else "n/a",
                    record.get("tokens_per_second", 0.0),
                    record["weights_bytes"] / 1e6,
                    record["save_seconds"],
                )
        if updates > 0 and self.version >= limit:
            self.admission.drop_untaken_prompts()
        self.status.stage = "done"
        self.steps.plot(self.steps.path.with_name("curves.png"), CURVES)
        return self.version
