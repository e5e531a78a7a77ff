"""Intervals a sceptic accepts: percentile bootstrap over questions, and the best constant answer.

Evaluation sets here are small (tens to a few hundred questions), so every mean the demo reports comes
with a 95% interval from resampling the questions, and stage-to-stage gains are judged on the same
questions (a paired bootstrap of the per-question differences), not by comparing two intervals.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ragr1.services.reward.answers import exact_match, normalize_answer, normalized_golds, token_f1

RESAMPLES = 2000
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean over questions with its bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.2f}, {self.high:.2f}]"

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap(values: Sequence[float], resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """The mean of ``values`` and its percentile-bootstrap interval (resampling the values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Estimate(float(x.mean()), float(low), float(high), int(x.size))


def paired_difference(after: Sequence[float], before: Sequence[float], **kwargs: float) -> Estimate:
    """``after - before`` on the same questions, in the same order: the interval of the mean gain."""
    if len(after) != len(before):
        raise ValueError(f"paired samples differ in size: {len(after)} and {len(before)}")
    return bootstrap([a - b for a, b in zip(after, before, strict=True)], **kwargs)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class ConstantBaseline:
    """The single answer that scores best on a set of questions when given to every one of them."""

    answer: str
    exact_match: Estimate
    f1: Estimate


def best_constant(golden_answers: Sequence[Sequence[str]]) -> ConstantBaseline:
    """The most frequent (normalised) gold answer of these very questions, scored on them: an upper bound
    for any strategy that answers without reading the question."""
    if not golden_answers:
        raise ValueError("no questions to find a constant answer for")
    counts = Counter(g for golds in golden_answers for g in set(normalized_golds(golds)))
    answer = counts.most_common(1)[0][0] if counts else ""
    ems = [exact_match(answer, normalized_golds(g)) for g in golden_answers]
    f1s = [token_f1(answer, normalized_golds(g)) for g in golden_answers]
    return ConstantBaseline(answer, bootstrap(ems), bootstrap(f1s))


def is_yes_no(golden_answers: Sequence[str]) -> bool:
    """Comparison questions a coin (or a constant "yes") answers half the time."""
    return any(normalize_answer(a) in ("yes", "no") for a in golden_answers)
