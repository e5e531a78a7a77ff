"""Prometheus metrics of the reward service."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from ragr1.services.common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS
from ragr1.services.reward.scoring import Parts

PARTS = ("total", "exact_match", "f1", "format", "process", "decomposition", "search_count")
# Parts are in [0, 1] except a weighted total, which may reach the sum of its weights, and ParallelSearch's
# search count, which falls below 0 for each search past its best (and its total with it).
PART_BUCKETS = (-1.0, -0.5, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 4.0)

SCORE_LATENCY = Histogram(
    "ragr1_reward_score_seconds", "Time to score one batch (core only).", buckets=LATENCY_BUCKETS
)
BATCH_ITEMS = Histogram(
    "ragr1_reward_batch_items", "Trajectories per Score call.", buckets=SIZE_BUCKETS
)
PART_VALUES = Histogram(
    "ragr1_reward_part_score", "Each part of each scored trajectory (mean = _sum / _count).", ["part"],
    buckets=PART_BUCKETS,
)
LAST_BATCH_MEAN = Gauge(
    "ragr1_reward_last_batch_mean_score", "Mean of each part over the last scored batch.", ["part"]
)
REASONS = Counter(
    "ragr1_reward_reasons_total", "Reasons given for zero or partial scores.", ["reason"]
)


def record_batch(results: Sequence[Parts], seconds: float) -> None:
    SCORE_LATENCY.observe(seconds)
    BATCH_ITEMS.observe(len(results))
    for part in PARTS:
        values = [float(getattr(r, part)) for r in results]
        for value in values:
            PART_VALUES.labels(part).observe(value)
        if values:
            LAST_BATCH_MEAN.labels(part).set(sum(values) / len(values))
    for r in results:
        for reason in r.reasons:
            REASONS.labels(reason).inc()
