"""The PPO loop around the queue: feed prompts, collect rollouts, update, checkpoint, acknowledge, publish.

Guarantees, and how:

- **Bounded staleness.** Prompts are admitted only while fewer than ``(max_staleness + 1) ×
  batch_size`` admitted rollouts are unsettled (settled = trained, dropped or dead-lettered), so a
  rollout is trained at most ``max_staleness`` versions after the version it was admitted at. Whatever
  still arrives staler (a slow replica) is dropped, acknowledged and counted.
- **Nothing trained twice, nothing lost.** A batch is acknowledged only after the checkpoint of the
  update that used it is on disk, and that checkpoint lists every rollout id trained so far. After a
  crash the restarted trainer loads the latest checkpoint, re-reads its pending entries (and takes over
  those pending under another consumer name, when it comes back under a new one), acknowledges the ones
  the checkpoint already lists, and trains the rest. Duplicates by
  rollout id (a producer that retried) are acknowledged without training.
- **Bad rollouts do not stop training.** Length disagreements, versions from the future and greedy
  rollouts (no behaviour distribution) are dead-lettered with the reason by the queue's ``validate`` hook.
- **Whole groups.** With ``samples_per_prompt > 1`` a batch holds only complete groups (the samples of
  one prompt, which GRPO compares with each other): a group still arriving waits, and a group with a
  stale or dead-lettered member is dropped whole.
- **Dynamic sampling** (DAPO's, verl's ``filter_groups``), when ``max_uniform_groups`` > 0: a complete group
  whose members all scored the same total has a group-relative advantage of zero and teaches nothing, so it
  is settled without training and the loop collects further groups instead, up to ``max_uniform_groups``
  per update; past that cap uniform groups are trained as usual (verl stops with an error instead, which on
  questions too hard for the model would end the run).
- **Weight-sync check.** For the rollouts sampled at the trainer's own version or one version behind
  (most of a batch when rollouts overlap updates; the updater keeps the weights before its last
  update), the trainer's log-probs under the weights that sampled them must equal the ones vLLM
  recorded; a gap above ``logprob_gap_threshold`` is reported as a probable weight-sync failure (the
  policy serves other weights than the trainer pushed).
- **Training-health alarms** (``health``): after each update, the likelihood change of the rollouts it
  reinforced, the entropy, the KL and the weight-sync gap are checked against their thresholds; an
  alarm that fires is logged with its name and the update, and counted.
- **A restarted replica is brought back.** A policy replica that restarted serves its starting weights as
  version 0, so every rollout it makes would be dropped as stale and no batch would come for the next
  push: while collecting, the loop asks the replicas for their version every ``resync_seconds`` and
  pushes the current one to any that is behind.
- **A bounded Redis.** After each update the loop deletes the prompts and rollouts that every consumer
  group is done with (``trim_streams``); what is pending or not yet delivered stays, and so do the
  dead letters and the done keys (7 days).
- **An idle policy after a finite run.** Reaching ``max_updates``, the loop deletes the prompts it
  admitted that no rollout worker has taken, so that the workers stop when their current work ends.

The admission counters live in Redis (``ragr1:trainer:<group>``) and move in the same transactions as
the stream writes and acknowledgements they count.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import redis

from ragr1.services.common.streams import PROMPTS, ROLLOUTS, Delivery, StreamQueue
from ragr1.services.trainer import metrics
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir, size_bytes
from ragr1.services.trainer.config import HealthSettings
from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.health import Fired, HealthMonitor
from ragr1.services.trainer.ppo_trainer import Sample
from ragr1.services.trainer.steplog import StepLog
from ragr1.v1 import common_pb2

log = logging.getLogger(__name__)

REWARD_PARTS = ("total", "exact_match", "f1", "format", "process")
# The parts whose group spread is logged: a GRPO group whose members all score the same teaches nothing,
# so the share of groups with a spread says whether a reward gives RL any signal at all.
SIGNAL_PARTS = ("total", "exact_match", "f1")
CURVES = (
    "reward_total",
    "reward_sampled",
    "reward_exact_match",
    "signal_total",
    "policy_loss",
    "value_loss",
    "kl",
    "entropy",
    "likelihood_change",
    "response_length",
    "answer_length",
    "clip_fraction",
    "approx_kl",
    "logprob_gap",
    "actor_lr",
    "tokens_per_second",
    "staleness_mean",
    "queue_seconds",
)


class Updater(Protocol):
    def update(self, samples: Sequence[Sample]) -> dict[str, float]: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def save_policy(self, directory: Path) -> None: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    def publish(self, version: int, checkpoint: Path) -> dict[str, str]: ...

    def sync(self, version: int, checkpoint: Path) -> dict[str, str]: ...


@dataclasses.dataclass
class LoopSettings:
    batch_size: int
    max_staleness: int
    max_updates: int
    poll_ms: int
    samples_per_prompt: int
    group: str
    consumer: str
    # The version the policy serves the starting weights as (e.g. 1 after an SFT stage was pushed).
    start_version: int = 0
    # The alarms' thresholds, the weight-sync gap's among them.
    health: HealthSettings = dataclasses.field(default_factory=HealthSettings)
    # Dynamic sampling: complete groups of equal scores skipped per update before they are trained anyway.
    max_uniform_groups: int = 0
    # How often, while collecting, the replicas are asked for their version and a restarted one (back at
    # its starting weights) is sent the current one again.
    resync_seconds: float = 10.0
    # After each update, delete the stream entries every group is done with (``StreamQueue.trim``).
    trim_streams: bool = True


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


def has_spread(scores: Sequence[float]) -> bool:
    """Whether a group's members scored differently: a group that scored alike gets zero advantage."""
    return max(scores) - min(scores) > 1e-9


def signal_share(scores: Sequence[float], groups: Sequence[str]) -> float:
    """The share of groups (of two or more members) whose members do not all score the same: the groups
    from which group-relative advantages can learn anything."""
    members: dict[str, list[float]] = {}
    for score, group in zip(scores, groups, strict=True):
        members.setdefault(group, []).append(score)
    compared = [values for values in members.values() if len(values) > 1]
    if not compared:
        raise ValueError("no group of two or more rollouts to compare")
    return sum(has_spread(v) for v in compared) / len(compared)


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


def lengths(rollouts: Sequence[common_pb2.Rollout]) -> dict[str, float]:
    """Mean and longest response (tokens after the prompt, inserted ones included, as verl counts them),
    mean generated tokens, and mean words of the answer (inside the last <answer>; 0 without one)."""
    response = [len(r.response_token_ids) for r in rollouts]
    return {
        "response_length": sum(response) / len(response),
        "response_length_max": float(max(response)),
        "generated_length": sum(sum(r.loss_mask) for r in rollouts) / len(rollouts),
        "answer_length": sum(len(r.reward.extracted_answer.split()) for r in rollouts) / len(rollouts),
    }


def _entry_seconds(entry_id: str) -> float:
    return int(entry_id.split("-", 1)[0]) / 1000.0


_DROPPED_MEMORY = 10_000

# Deletes the prompts no consumer group other than the trainer's own has read (their ids are above
# every other group's last-delivered id) and takes their rollouts out of the admission count, in one
# step, so that a worker cannot take an entry between the check and the delete.
# KEYS: prompts stream, counters hash. ARGV: the trainer's group, rollouts per prompt.
_DROP_UNTAKEN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local last, last_ms, last_seq = '0-0', 0, 0
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  if info['name'] ~= ARGV[1] then
    local ms, seq = parse(info['last-delivered-id'])
    if ms > last_ms or (ms == last_ms and seq > last_seq) then
      last, last_ms, last_seq = info['last-delivered-id'], ms, seq
    end
  end
end
local entries = redis.call('XRANGE', KEYS[1], '(' .. last, '+')
for _, entry in ipairs(entries) do redis.call('XDEL', KEYS[1], entry[1]) end
if #entries > 0 then redis.call('HINCRBY', KEYS[2], 'admitted', -#entries * tonumber(ARGV[2])) end
return #entries
"""


class PPOLoop:
    def __init__(
        self,
        settings: LoopSettings,
        client: redis.Redis,
        tasks: Sequence[common_pb2.PromptTask],
        updater: Updater,
        checkpoints: Checkpointer,
        steps: StepLog,
        publisher: Publisher | None = None,
        status: TrainerStatus | None = None,
    ) -> None:
        if not tasks:
            raise ValueError("no prompts to train on")
        self.settings = settings
        self.redis = client
        self.tasks = list(tasks)
        self.updater = updater
        self.checkpoints = checkpoints
        self.steps = steps
        self.publisher = publisher
        self.status = status or TrainerStatus()
        self.version = settings.start_version
        self.trained: set[str] = set()
        self.trained_order: list[str] = []
        self.stop_event = threading.Event()
        # Annotated Any: mypy does not match the protobuf stubs' ``id`` with the Payload protocol.
        self.prompts: StreamQueue[Any] = StreamQueue(
            client, PROMPTS, common_pb2.PromptTask, group=settings.group
        )
        self.rollouts: StreamQueue[Any] = StreamQueue(
            client,
            ROLLOUTS,
            common_pb2.Rollout,
            group=settings.group,
            consumer=settings.consumer,
            validate=self._validate,
        )
        self.counters = f"ragr1:trainer:{settings.group}"
        # In every task id this trainer admits: rollout ids derive from task ids and done marks last a week,
        # so another run on the same Redis must not reuse them (its rollouts would be skipped as duplicates).
        self.run_id = uuid.uuid4().hex[:8]
        self._buffer: list[Delivery[Any]] = []
        # Groups dropped whole, by reason ("stale", "incomplete"): their later members are dropped too.
        self._dropped: dict[str, str] = {}
        self._warned_top_p = False
        self._queue_seconds = 0.0
        # The total rewards of each group dynamic sampling skipped since the last update: with them, the mean
        # reward of everything the policy was sampled on, which is the curve that shows learning (the
        # trained batch holds only groups with a spread, so its mean stays near the middle by design).
        self._skipped: list[list[float]] = []
        self._synced_at = time.monotonic()
        self.health = HealthMonitor(settings.health)
        self.health.export_metrics()

    # -- state ----------------------------------------------------------------------------------
    def resume(self) -> None:
        """Loads the latest checkpoint (weights, optimiser, trained ids), if any."""
        latest = self.checkpoints.latest()
        if latest is None:
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
            # Replicas may have missed the last version when the trainer died (or restarted since, back at
            # version 0): those behind get it. The others refuse a version they serve already, which
            # ``publish`` would count towards stopping, so a trainer restarted three times stopped.
            self.publisher.sync(self.version, policy_dir(path))

    def _settled(self) -> int:
        """Admitted rollouts no longer in flight: trained, dropped, dead-lettered, or never to come because
        a rollout worker dead-lettered their prompt (each of whose samples was admitted)."""
        settled = int(self.redis.hget(self.counters, "settled") or 0)
        dead_prompts = int(self.redis.xlen(self.prompts.dead_stream)) * max(1, self.settings.samples_per_prompt)
        return settled + int(self.redis.xlen(self.rollouts.dead_stream)) + dead_prompts

    # -- prompts --------------------------------------------------------------------------------
    def feed(self) -> int:
        """Admits prompts up to the staleness window; returns how many tasks were queued."""
        s = self.settings
        per_task = max(1, s.samples_per_prompt)
        window = (s.max_staleness + 1) * s.batch_size
        admitted = int(self.redis.hget(self.counters, "admitted") or 0)
        room = window - (admitted - self._settled())
        count = room // per_task
        if count <= 0:
            return 0
        first = int(self.redis.hget(self.counters, "tasks") or 0)
        batch = []
        for n in range(first, first + count):
            template = self.tasks[n % len(self.tasks)]
            task = common_pb2.PromptTask()
            task.CopyFrom(template)
            task.id = f"{template.id}#{self.run_id}-{n}"
            task.group_id = task.id
            task.num_samples = per_task
            task.admitted_at_version = self.version
            batch.append(task)
        pipe = self.redis.pipeline(transaction=True)
        self.prompts.produce(batch, pipe)
        pipe.hincrby(self.counters, "tasks", count)
        pipe.hincrby(self.counters, "admitted", count * per_task)
        pipe.execute()
        return count

    # -- rollouts -------------------------------------------------------------------------------
    def _settle(self, deliveries: Sequence[Delivery[Any]], count: bool = True) -> None:
        """Acknowledges; ``count=False`` for second copies of buffered rollouts, which were never admitted
        on their own and whose ids must not be marked done before the originals are trained."""
        n = len(deliveries)
        self.rollouts.ack(
            deliveries, also=(lambda pipe: pipe.hincrby(self.counters, "settled", n)) if count else None, done=count
        )

    def _group(self, rollout: common_pb2.Rollout) -> str:
        if self.settings.samples_per_prompt <= 1:
            return str(rollout.id)
        return str(rollout.group_id or rollout.task_id)

    def _validate(self, rollout: common_pb2.Rollout) -> str | None:
        reason = check_rollout(rollout, self.version)
        if reason is not None:
            # Its group can never be complete: the members already here or still coming are dropped.
            self._dropped.setdefault(self._group(rollout), "incomplete")
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
        buffered = {d.message.id for d in self._buffer}
        trained_before, duplicates = [], []
        for d in deliveries:
            rollout = d.message
            if rollout.id in self.trained:
                trained_before.append(d)
            elif rollout.id in buffered:
                duplicates.append(d)
            else:
                self._buffer.append(d)
                buffered.add(rollout.id)
        if trained_before:
            # Trained and checkpointed before a crash that came before their acknowledgement.
            self._settle(trained_before)
            metrics.ROLLOUTS.labels("duplicate").inc(len(trained_before))
        if duplicates:
            self._settle(duplicates, count=False)
            metrics.ROLLOUTS.labels("duplicate").inc(len(duplicates))
        self._drop_groups()

    def _drop_groups(self) -> None:
        """Settles, without training, every buffered group that has a member staler than
        ``max_staleness`` versions or a member that was dead-lettered."""
        for d in self._buffer:
            if self.version - d.message.policy_version > self.settings.max_staleness:
                self._dropped.setdefault(self._group(d.message), "stale")
        keep: list[Delivery[Any]] = []
        dropped: dict[str, list[Delivery[Any]]] = {"stale": [], "incomplete": []}
        for d in self._buffer:
            reason = self._dropped.get(self._group(d.message))
            (keep if reason is None else dropped[reason]).append(d)
        self._buffer = keep
        if len(self._dropped) > _DROPPED_MEMORY:
            # Members of a group arrive close together; forget the oldest half.
            self._dropped = dict(list(self._dropped.items())[_DROPPED_MEMORY // 2 :])
        for reason, deliveries in dropped.items():
            if not deliveries:
                continue
            self._settle(deliveries)
            metrics.ROLLOUTS.labels("stale" if reason == "stale" else "incomplete_group").inc(len(deliveries))
            if reason == "stale":
                self.status.rollouts_dropped_stale += len(deliveries)
            log.info("dropped %d rollouts (%s groups)", len(deliveries), reason)

    def _complete_groups(self) -> list[list[Delivery[Any]]]:
        """Buffered groups that have all their samples, oldest first."""
        size = max(1, self.settings.samples_per_prompt)
        groups: dict[str, list[Delivery[Any]]] = {}
        for d in self._buffer:
            groups.setdefault(self._group(d.message), []).append(d)
        return [members[:size] for members in groups.values() if len(members) >= size]

    def _skip_uniform_groups(self) -> None:
        """Dynamic sampling: settles, without training, complete groups whose members all scored the same
        total, while this update's cap allows."""
        if self.settings.samples_per_prompt <= 1:
            return
        for members in self._complete_groups():
            if len(self._skipped) >= self.settings.max_uniform_groups:
                return
            scores = [d.message.reward.total for d in members]
            if has_spread(scores):
                continue
            skipped = {id(d) for d in members}
            self._buffer = [d for d in self._buffer if id(d) not in skipped]
            self._settle(members)
            self._skipped.append(scores)
            metrics.ROLLOUTS.labels("uniform_group").inc(len(members))
            log.info("skipped a group of %d rollouts that all scored %.3f (dynamic sampling)", len(members), scores[0])

    def _ready(self) -> int:
        return sum(len(g) for g in self._complete_groups())

    def collect(self) -> None:
        """Feeds prompts and reads rollouts until a batch of whole groups is buffered (or a stop is asked for)."""
        s = self.settings
        self._drop_groups()
        while self._ready() < s.batch_size and not self.stop_event.is_set():
            start = time.perf_counter()
            self.feed()
            wanted = max(s.samples_per_prompt, s.batch_size - self._ready())
            fresh = self.rollouts.consume(wanted, block_ms=s.poll_ms)
            self._admit(fresh)
            self._skip_uniform_groups()
            self._resync()
            self._queue_seconds += time.perf_counter() - start
            metrics.QUEUE_DEPTH.labels(PROMPTS).set(self.prompts.depth())
            metrics.QUEUE_DEPTH.labels(ROLLOUTS).set(self.rollouts.pending())

    def _resync(self) -> None:
        """Every ``resync_seconds``: the current version to the replicas that serve an older one."""
        if self.publisher is None or not self.status.checkpoint_path:
            return
        if time.monotonic() - self._synced_at < self.settings.resync_seconds:
            return
        self._synced_at = time.monotonic()
        self.publisher.sync(self.version, Path(self.status.checkpoint_path))

    def _take_batch(self) -> list[Delivery[Any]]:
        batch = [d for group in self._complete_groups() for d in group][: self.settings.batch_size]
        taken = {id(d) for d in batch}
        self._buffer = [d for d in self._buffer if id(d) not in taken]
        return batch

    def drop_untaken_prompts(self) -> int:
        """Deletes the admitted prompts no rollout worker has taken yet; returns how many."""
        script = self.redis.register_script(_DROP_UNTAKEN)
        count = int(
            script(keys=[PROMPTS, self.counters], args=[self.settings.group, max(1, self.settings.samples_per_prompt)])
        )
        if count:
            log.info("training is done: removed %d prompts no rollout worker had taken", count)
        return count

    # -- one update -----------------------------------------------------------------------------
    def train_batch(self) -> dict[str, Any]:
        batch = self._take_batch()
        rollouts = [d.message for d in batch]
        staleness = [self.version - r.policy_version for r in rollouts]
        for lag in staleness:
            metrics.STALENESS.observe(lag)
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
        path = self.checkpoints.save(new_version, meta, self.updater.save_policy, self.updater.state())
        save_seconds = time.perf_counter() - saving
        served = policy_dir(path)
        start = time.perf_counter()
        self._settle(batch)
        self._queue_seconds += time.perf_counter() - start
        self.version = new_version
        self.trained.update(ids)
        self.trained_order += ids
        pushing = time.perf_counter()
        published = self.publisher.publish(new_version, served) if self.publisher is not None else {}
        push_seconds = time.perf_counter() - pushing
        now = time.time()
        for d in batch:
            metrics.ROLLOUT_AGE.observe(max(0.0, now - _entry_seconds(d.entry_id)))
        record: dict[str, Any] = {"step": new_version, "version": new_version, "rollout_ids": ids, **stats}
        sampled = [r.reward.total for r in rollouts] + [score for group in self._skipped for score in group]
        for part in REWARD_PARTS:
            record[f"reward_{part}"] = sum(getattr(r.reward, part) for r in rollouts) / len(rollouts)
        if self.settings.samples_per_prompt > 1:
            groups = [self._group(r) for r in rollouts]
            for part in SIGNAL_PARTS:
                record[f"signal_{part}"] = signal_share([getattr(r.reward, part) for r in rollouts], groups)
        record.update(
            {
                "staleness_mean": sum(staleness) / len(staleness),
                "staleness_max": max(staleness),
                "queue_seconds": self._queue_seconds,
                "queue_share": self._queue_seconds
                / max(1e-9, self._queue_seconds + stats.get("update_seconds", 0.0)),
                "checkpoint": str(served),
                # What each update costs in weights: written once to the checkpoint volume, then loaded
                # by every replica (push_seconds waits for them all).
                "push_bytes": size_bytes(served),
                "save_seconds": save_seconds,
                "push_seconds": push_seconds,
                "published": published,
                "groups_skipped_uniform": len(self._skipped),
                "reward_sampled": sum(sampled) / len(sampled),
                "rollouts_sampled": len(sampled),
                **lengths(rollouts),
            }
        )
        fired = self.health.check(record)
        record["alarms"] = [f.alarm.name for f in fired]
        record["weight_sync_alarm"] = "weight_sync" in record["alarms"]
        if self.settings.trim_streams:
            record["trimmed"] = self.rollouts.trim() + self.prompts.trim()
        self._queue_seconds = 0.0
        self._skipped = []
        self.steps.write(record)
        self._observe(record, served)
        self._report(fired, record)
        return record

    def _report(self, fired: Sequence[Fired], record: dict[str, Any]) -> None:
        """Each alarm that fired, in the log (naming it and the update) and in the metrics. A weight-sync
        failure is an error: the policy probably serves other weights than the trainer pushed."""
        for f in fired:
            alarm = f.alarm
            metrics.HEALTH_ALARMS.labels(alarm.name).inc()
            if alarm.name == "weight_sync":
                metrics.WEIGHT_SYNC_ALARMS.inc()
                self.status.weight_sync_alarms += 1
                log.error(
                    "training-health alarm weight_sync at update %d: probable weight-sync failure (stale or "
                    "wrong weights in the policy): the trainer's log-probs differ from vLLM's by %.3f nats per "
                    "generated token (max %.3f) over %d rollouts, above logprob_gap_threshold %.3f",
                    record["version"],
                    f.value,
                    record.get("logprob_gap_max", f.value),
                    int(record.get("logprob_gap_rollouts", 0)),
                    f.threshold,
                )
                continue
            log.warning(
                "training-health alarm %s at update %d: %s (%s %.4g %s %s %.4g)",
                alarm.name,
                record["version"],
                alarm.meaning,
                alarm.key,
                f.value,
                alarm.comparison,
                alarm.threshold,
                f.threshold,
            )

    def _observe(self, record: dict[str, Any], path: Path) -> None:
        metrics.UPDATES.inc()
        metrics.ROLLOUTS.labels("trained").inc(len(record["rollout_ids"]))
        metrics.POLICY_VERSION.set(self.version)
        for part in REWARD_PARTS:
            metrics.REWARD.labels(part).set(record[f"reward_{part}"])
        for part in SIGNAL_PARTS:
            if f"signal_{part}" in record:
                metrics.GROUP_SIGNAL.labels(part).set(record[f"signal_{part}"])
        metrics.LOSS.labels("policy").set(record.get("policy_loss", 0.0))
        metrics.LOSS.labels("value").set(record.get("value_loss", 0.0))
        metrics.KL.set(record.get("kl", 0.0))
        metrics.ENTROPY.set(record.get("entropy", 0.0))
        if "likelihood_change" in record:
            metrics.LIKELIHOOD_CHANGE.set(record["likelihood_change"])
        metrics.LIKELIHOOD_FALLING.set(record["likelihood_falling_updates"])
        metrics.RESPONSE_LENGTH.labels("mean").set(record["response_length"])
        metrics.RESPONSE_LENGTH.labels("max").set(record["response_length_max"])
        metrics.GENERATED_LENGTH.set(record["generated_length"])
        metrics.ANSWER_LENGTH.set(record["answer_length"])
        if "logprob_gap" in record:
            metrics.LOGPROB_GAP.labels("mean").set(record["logprob_gap"])
            metrics.LOGPROB_GAP.labels("max").set(record.get("logprob_gap_max", record["logprob_gap"]))
            self.status.last_logprob_gap = record["logprob_gap"]
        metrics.CLIP_FRACTION.set(record.get("clip_fraction", 0.0))
        metrics.APPROX_KL.set(record.get("approx_kl", 0.0))
        for stat in ("mean", "min", "max"):
            if f"ratio_{stat}" in record:
                metrics.RATIO.labels(stat).set(record[f"ratio_{stat}"])
        for model in ("actor", "critic"):
            if f"{model}_lr" in record:
                metrics.LEARNING_RATE.labels(model).set(record[f"{model}_lr"])
                metrics.GRAD_NORM.labels(model).set(record[f"{model}_grad_norm"])
        metrics.TOKENS_PER_SECOND.set(record.get("tokens_per_second", 0.0))
        metrics.UPDATE_SECONDS.observe(record.get("update_seconds", 0.0))
        metrics.QUEUE_SECONDS.observe(record["queue_seconds"])
        st = self.status
        st.step, st.policy_version = self.version, self.version
        st.rollouts_trained = len(self.trained)
        st.last_mean_reward = record["reward_total"]
        st.checkpoint_path = str(path)

    def run(self) -> int:
        """Resumes, then trains until ``max_updates`` updates past ``start_version`` (0 = until stopped);
        returns the version."""
        self.rollouts.ensure_group()
        self.prompts.ensure_group()
        self.resume()
        # This consumer's delivered-but-unacknowledged entries: the batch a crash interrupted; then those of
        # a predecessor under another name (one trainer per group, so whoever else holds entries is gone).
        self._admit(self.rollouts.consume(max(1000, 4 * self.settings.batch_size), pending=True))
        self._admit(self.rollouts.take_over())
        self.status.stage = "ppo"
        self.status.policy_version = self.version
        updates = self.settings.max_updates
        limit = self.settings.start_version + updates
        while not self.stop_event.is_set() and (updates <= 0 or self.version < limit):
            self.collect()
            if self._ready() >= self.settings.batch_size:
                record = self.train_batch()
                log.info(
                    "update %d: reward %.3f, entropy %.3f, likelihood change %s, clip fraction %.3f, log-prob gap "
                    "%s, %.0f tokens/s; weights %.1f MB saved in %.1f s, pushed in %.1f s",
                    record["version"],
                    record["reward_total"],
                    record.get("entropy", 0.0),
                    f"{record['likelihood_change']:+.4f}" if "likelihood_change" in record else "n/a",
                    record.get("clip_fraction", 0.0),
                    f"{record['logprob_gap']:.4f}" if "logprob_gap" in record else "n/a",
                    record.get("tokens_per_second", 0.0),
                    record["push_bytes"] / 1e6,
                    record["save_seconds"],
                    record["push_seconds"],
                )
        if updates > 0 and self.version >= limit:
            self.drop_untaken_prompts()
        self.status.stage = "done"
        self.steps.plot(self.steps.path.with_name("curves.png"), CURVES)
        return self.version
