"""What each update shows outside the step log: its record as Prometheus metrics, and the training-health
alarms it set off in the log and the alarm counters."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ragr1.services.trainer import metrics
from ragr1.services.trainer.health import Fired
from ragr1.services.trainer.loop.record import REWARD_PARTS, SIGNAL_PARTS

# The loop's parts log under the name the loop had as one module, which log filters select.
log = logging.getLogger(__package__)


def entry_seconds(entry_id: str) -> float:
    """When a stream entry was added (its id's milliseconds), in seconds since the epoch."""
    return int(entry_id.split("-", 1)[0]) / 1000.0


def observe_staleness(staleness: Sequence[int]) -> None:
    """The versions each rollout of a batch is behind the trainer, as it goes into the update."""
    for lag in staleness:
        metrics.STALENESS.observe(lag)


def observe_ages(entry_ids: Sequence[str], now: float) -> None:
    """How long each rollout of a batch waited, from entering the stream to its update being saved."""
    for entry_id in entry_ids:
        metrics.ROLLOUT_AGE.observe(max(0.0, now - entry_seconds(entry_id)))


def export(record: Mapping[str, Any]) -> None:
    """An update's step record as the trainer's metrics (``ragr1_trainer_…``)."""
    metrics.UPDATES.inc()
    metrics.ROLLOUTS.labels("trained").inc(len(record["rollout_ids"]))
    metrics.POLICY_VERSION.set(record["version"])
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


def report(fired: Sequence[Fired], record: Mapping[str, Any]) -> None:
    """Each alarm that fired, in the log (naming it and the update) and in the metrics. A weight-sync
    failure is an error: the policy probably serves other weights than the trainer published."""
    for f in fired:
        alarm = f.alarm
        metrics.HEALTH_ALARMS.labels(alarm.name).inc()
        if alarm.name == "weight_sync":
            metrics.WEIGHT_SYNC_ALARMS.inc()
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
