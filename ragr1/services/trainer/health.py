"""Training-health alarms: signals that lead the reward.

Reward is a lagging signal: in the collapses of Search-R1-style GRPO runs the likelihood of the
responses the update means to reinforce falls (likelihood displacement, the LLDS analysis), and the
policy's entropy collapses, many updates before the reward does. Each alarm watches one value of the
step record, exported as a Prometheus metric, against one ``HealthSettings`` threshold:

- ``likelihood_falling``: ``likelihood_falling_updates`` (updates in a row whose ``likelihood_change``
  was negative) at or above ``likelihood_falling_updates``;
- ``entropy_low``: ``entropy`` below ``entropy_floor``;
- ``kl_high``: ``kl`` above ``kl_ceiling``;
- ``weight_sync``: ``logprob_gap`` above ``logprob_gap_threshold``.

The trainer exports the thresholds (``ragr1_trainer_alarm_threshold{alarm}``) and the alert rules in
``deploy/prometheus/alerts.yml`` compare each metric against its threshold with the comparison below,
so that a threshold has one home, the trainer's settings, and the log and the alerts agree.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from prometheus_client import Gauge

from ragr1.services.trainer import metrics
from ragr1.services.trainer.config import HealthSettings

# The comparisons an alarm may make, as PromQL writes them.
COMPARISONS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, "<": operator.lt, ">=": operator.ge}


@dataclasses.dataclass(frozen=True)
class Alarm:
    name: str  # the ``alarm`` label of the threshold and the counter, and of the alert rule
    key: str  # the step record's value it watches
    metric: Gauge  # where that value is exported
    threshold: str  # the HealthSettings field; 0 turns the alarm off (except weight_sync, always on)
    comparison: str  # fires when ``value <comparison> threshold``
    meaning: str

    @property
    def metric_name(self) -> str:
        return str(next(iter(self.metric.describe())).name)

    def fires(self, value: float, threshold: float) -> bool:
        """Also on a value that is not a number: the update broke the model (the alert rules agree)."""
        return not math.isfinite(value) or COMPARISONS[self.comparison](value, threshold)


ALARMS = (
    Alarm(
        "likelihood_falling", "likelihood_falling_updates", metrics.LIKELIHOOD_FALLING,
        "likelihood_falling_updates", ">=",
        "updates in a row lowered the log-likelihood of the rollouts they reinforced (likelihood displacement)",
    ),
    Alarm("entropy_low", "entropy", metrics.ENTROPY, "entropy_floor", "<",
          "the policy's entropy over generated tokens is below its floor (entropy collapse)"),
    Alarm("kl_high", "kl", metrics.KL, "kl_ceiling", ">",
          "the policy's KL to the reference is above its ceiling (drifting from the reference)"),
    Alarm("weight_sync", "logprob_gap", metrics.LOGPROB_GAP, "logprob_gap_threshold", ">",
          "the trainer's log-probs differ from the policy's (stale or wrong weights in the policy)"),
)


@dataclasses.dataclass(frozen=True)
class Fired:
    alarm: Alarm
    value: float
    threshold: float


def thresholds(settings: HealthSettings) -> dict[str, float]:
    """Alarm name -> threshold, for the alarms that are on."""
    values = {a.name: float(getattr(settings, a.threshold)) for a in ALARMS}
    return {name: value for name, value in values.items() if value > 0}


class HealthMonitor:
    """Checks every update's record against the thresholds; keeps the run of falling likelihoods (it
    starts again from 0 when the trainer restarts)."""

    def __init__(self, settings: HealthSettings) -> None:
        self.settings = settings
        self.thresholds = thresholds(settings)
        self.falling = 0

    def export_metrics(self) -> None:
        """Each alarm's threshold, and its counter at 0: a labelled counter has no series until a label is
        used, so a healthy run would show "no data" on the dashboard's alarms panel and give ``increase()``
        nothing to start from when the first alarm fires."""
        for name, value in self.thresholds.items():
            metrics.ALARM_THRESHOLD.labels(name).set(value)
            metrics.HEALTH_ALARMS.labels(name)

    def check(self, record: MutableMapping[str, Any]) -> list[Fired]:
        """Adds ``likelihood_falling_updates`` to ``record`` and returns the alarms it sets off. An update
        that reinforced no rollout (no ``likelihood_change``) leaves the run as it was."""
        change = record.get("likelihood_change")
        if isinstance(change, int | float):
            self.falling = self.falling + 1 if not change >= 0 else 0  # NaN counts as falling
        record["likelihood_falling_updates"] = self.falling
        return fired(record, self.thresholds)


def fired(record: Mapping[str, Any], limits: Mapping[str, float]) -> list[Fired]:
    out = []
    for alarm in ALARMS:
        value, threshold = record.get(alarm.key), limits.get(alarm.name)
        if threshold is not None and isinstance(value, int | float) and alarm.fires(float(value), threshold):
            out.append(Fired(alarm, float(value), threshold))
    return out
