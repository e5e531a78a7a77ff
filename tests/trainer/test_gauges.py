"""An update's record and alarms as the trainer shows them outside the step log: the Prometheus metrics
(read back from the registry the /metrics endpoint serves) and the alarm log lines."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ragr1.services.trainer.config import HealthSettings
from ragr1.services.trainer.health import HealthMonitor
from ragr1.services.trainer.loop import gauges

LOGGER = "ragr1.services.trainer.loop"


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def a_record(**overrides: Any) -> dict[str, Any]:
    """What the loop hands over after an update: the step record with the health check's count."""
    record: dict[str, Any] = {
        "version": 12, "rollout_ids": ["r0", "r1", "r2"],
        "reward_total": 0.5, "reward_exact_match": 0.25, "reward_f1": 0.4, "reward_format": 0.9, "reward_process": 0.1,
        "signal_total": 0.75, "signal_exact_match": 0.5,
        "policy_loss": -0.02, "kl": 0.003, "entropy": 1.7, "likelihood_change": 0.01, "likelihood_falling_updates": 0,
        "response_length": 40.0, "response_length_max": 96.0, "generated_length": 30.0, "answer_length": 2.5,
        "logprob_gap": 0.02, "clip_fraction": 0.1, "approx_kl": 0.001, "ratio_mean": 1.0, "ratio_max": 1.3,
        "actor_lr": 1e-6, "actor_grad_norm": 0.8, "tokens_per_second": 123.0, "update_seconds": 2.0,
        "queue_seconds": 0.5,
    }
    record.update(overrides)
    return record


def test_export_shows_the_record_in_the_metrics() -> None:
    updates = value("ragr1_trainer_updates_total") or 0.0
    trained = value("ragr1_trainer_rollouts_total", outcome="trained") or 0.0
    queue_sum = value("ragr1_trainer_queue_seconds_sum") or 0.0
    gauges.export(a_record())
    assert value("ragr1_trainer_updates_total") == updates + 1
    assert value("ragr1_trainer_rollouts_total", outcome="trained") == trained + 3
    assert value("ragr1_trainer_policy_version") == 12
    assert value("ragr1_trainer_reward", part="exact_match") == 0.25
    assert value("ragr1_trainer_reward", part="process") == 0.1
    assert value("ragr1_trainer_group_signal_ratio", part="total") == 0.75
    assert value("ragr1_trainer_loss", kind="policy") == -0.02
    assert value("ragr1_trainer_entropy_nats") == 1.7 and value("ragr1_trainer_kl") == 0.003
    assert value("ragr1_trainer_response_length_tokens", stat="max") == 96.0
    assert value("ragr1_trainer_generated_length_tokens") == 30.0
    assert value("ragr1_trainer_answer_length_words") == 2.5
    # One gap measured: its max is the mean.
    assert value("ragr1_trainer_logprob_gap_nats", stat="max") == 0.02
    assert value("ragr1_trainer_policy_ratio", stat="max") == 1.3
    assert value("ragr1_trainer_learning_rate", model="actor") == 1e-6
    assert value("ragr1_trainer_grad_norm", model="actor") == 0.8
    assert value("ragr1_trainer_tokens_per_second") == 123.0
    assert value("ragr1_trainer_queue_seconds_sum") == pytest.approx(queue_sum + 0.5)


def test_a_value_an_update_did_not_measure_keeps_the_last_one_measured_or_reads_zero() -> None:
    gauges.export(a_record(likelihood_change=0.01, logprob_gap=0.02, logprob_gap_max=0.05))
    assert value("ragr1_trainer_logprob_gap_nats", stat="max") == 0.05
    # No rollout at the trainer's version (no gap), none reinforced (no likelihood change), one sample per
    # prompt (no group signal): those show the last update that measured them. No critic: no value loss, 0.
    unmeasured = a_record(version=13)
    for key in ("likelihood_change", "logprob_gap", "signal_total", "signal_exact_match"):
        del unmeasured[key]
    gauges.export(unmeasured)
    assert value("ragr1_trainer_likelihood_change_nats") == 0.01
    assert value("ragr1_trainer_logprob_gap_nats", stat="mean") == 0.02
    assert value("ragr1_trainer_group_signal_ratio", part="total") == 0.75
    assert value("ragr1_trainer_loss", kind="value") == 0.0  # no critic
    assert value("ragr1_trainer_policy_version") == 13


def test_the_staleness_and_the_age_of_each_rollout_are_observed() -> None:
    count = value("ragr1_trainer_rollout_staleness_versions_count") or 0.0
    lagging = value("ragr1_trainer_rollout_staleness_versions_bucket", le="1.0") or 0.0
    gauges.observe_staleness([0, 1, 3])
    assert value("ragr1_trainer_rollout_staleness_versions_count") == count + 3
    assert value("ragr1_trainer_rollout_staleness_versions_bucket", le="1.0") == lagging + 2
    age = value("ragr1_trainer_rollout_age_seconds_sum") or 0.0
    # Ages from the stream ids' milliseconds; a clock behind the entry's reads 0, not a negative age.
    gauges.observe_ages(["1000000-0", "1002500-3", "1009000-0"], now=1003.0)
    assert value("ragr1_trainer_rollout_age_seconds_sum") == pytest.approx(age + 3.0 + 0.5)


def test_each_alarm_is_logged_with_its_update_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    monitor = HealthMonitor(HealthSettings(entropy_floor=0.5))
    record = a_record(entropy=0.2, logprob_gap=0.4, logprob_gap_max=0.9, logprob_gap_rollouts=6)
    fired = monitor.check(record)
    assert [f.alarm.name for f in fired] == ["entropy_low", "weight_sync"]
    entropy = value("ragr1_trainer_health_alarms_total", alarm="entropy_low") or 0.0
    sync = value("ragr1_trainer_health_alarms_total", alarm="weight_sync") or 0.0
    sync_total = value("ragr1_trainer_weight_sync_alarms_total") or 0.0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        gauges.report(fired, record)
    assert value("ragr1_trainer_health_alarms_total", alarm="entropy_low") == entropy + 1
    assert value("ragr1_trainer_health_alarms_total", alarm="weight_sync") == sync + 1
    assert value("ragr1_trainer_weight_sync_alarms_total") == sync_total + 1
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (LOGGER, logging.WARNING,
         "training-health alarm entropy_low at update 12: the policy's entropy over generated tokens is below its "
         "floor (entropy collapse) (entropy 0.2 < entropy_floor 0.5)"),
        (LOGGER, logging.ERROR,
         "training-health alarm weight_sync at update 12: probable weight-sync failure (stale or wrong weights in "
         "the policy): the trainer's log-probs differ from vLLM's by 0.400 nats per generated token (max 0.900) "
         "over 6 rollouts, above logprob_gap_threshold 0.100"),
    ]


def test_no_alarm_no_line_and_no_count(caplog: pytest.LogCaptureFixture) -> None:
    total = value("ragr1_trainer_weight_sync_alarms_total") or 0.0
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        gauges.report([], a_record())
    assert caplog.records == [] and value("ragr1_trainer_weight_sync_alarms_total") == total
