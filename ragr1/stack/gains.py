"""The demo's stage-to-stage gains: each stage's evaluation (``StageResult``) against the one before, paired
question by question, and SFT -> RL on the more held-out questions; never between stages evaluated under
another corpus or retriever (``evaluate.incomparable``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from ragr1.stack import evaluate, stats

STAGES = ("base", "sft", "rl")
EVAL_MODES = ("none", "single", "multi")
# The stages evaluated on the more held-out questions (``gain_questions``), in the mode RL trains.
GAIN_STAGES = ("sft", "rl")


@dataclasses.dataclass
class StageResult:
    stage: str
    policy_version: int
    summaries: list[evaluate.EvalSummary]
    # Per question, keyed by (source, mode): rollout records in question order (for paired gains).
    records: list[dict[str, Any]]
    seconds: float
    # What the numbers depend on (``evaluate.provenance``): corpus, retriever, checkpoint, sampling, seed, code.
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The more held-out questions' (``gain_questions``; GAIN_STAGES only), in the mode RL trains.
    gain_summaries: list[evaluate.EvalSummary] = dataclasses.field(default_factory=list)
    gain_records: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def paired_scores(records: Sequence[dict[str, Any]], key: str, source: str = "all", mode: str | None = None
                  ) -> list[float]:
    """``key`` of the records of ``source`` ("all": every one) in ``mode`` (None: any), ordered by source and
    question, as every stage's are: the scores a paired gain compares question by question."""
    rows = [r for r in records if source in ("all", r["data_source"]) and mode in (None, r["mode"])]
    return [float(r[key]) for r in sorted(rows, key=lambda r: (r["data_source"], r["question"]))]


def _pairs(stages: Sequence[StageResult]) -> Iterator[tuple[StageResult, StageResult, str]]:
    """Each evaluated stage and the one evaluated before it, with why they must not be paired ("" if they may:
    both evaluated under the same corpus and retriever)."""
    by_stage = {s.stage: s for s in stages}
    for earlier, later in itertools.pairwise(STAGES):
        if earlier in by_stage and later in by_stage:
            before, after = by_stage[earlier], by_stage[later]
            yield before, after, evaluate.incomparable(before.provenance, after.provenance)


def refused_gains(stages: Sequence[StageResult]) -> list[dict[str, str]]:
    return [{"from": before.stage, "to": after.stage,
             "reason": f"not evaluated under the same corpus and retriever: {why}"}
            for before, after, why in _pairs(stages) if why]


def stage_gains(stages: Sequence[StageResult], sources: Sequence[str]) -> list[dict[str, Any]]:
    """Per search mode, for every source and for all of them pooled ("all"): each stage against the one before,
    on the same questions."""
    out = []
    for before, after, why in _pairs(stages):
        if why:
            continue
        for source in [*sources, "all"]:
            for mode in EVAL_MODES:
                em, f1 = (stats.paired_difference(paired_scores(after.records, key, source, mode),
                                                  paired_scores(before.records, key, source, mode))
                          for key in ("exact_match", "f1"))
                out.append({"from": before.stage, "to": after.stage, "source": source, "mode": mode,
                            "exact_match": dataclasses.asdict(em), "f1": dataclasses.asdict(f1)})
    return out


def held_out_gain(stages: Sequence[StageResult], mode: str) -> dict[str, Any] | None:
    """SFT -> RL in ``mode`` (the one RL trains) on the more held-out questions, the sources pooled; None
    without them, or where the two stages must not be paired (``refused_gains`` says why)."""
    by_stage = {s.stage: s for s in stages}
    before, after = (by_stage.get(stage) for stage in GAIN_STAGES)
    if before is None or after is None or not before.gain_records or not after.gain_records:
        return None
    if evaluate.incomparable(before.provenance, after.provenance):
        return None
    out: dict[str, Any] = {"from": before.stage, "to": after.stage, "mode": mode,
                           "questions": len(before.gain_records)}
    for key in ("exact_match", "f1"):
        was, now = paired_scores(before.gain_records, key), paired_scores(after.gain_records, key)
        out[key] = {before.stage: dataclasses.asdict(stats.bootstrap(was)),
                    after.stage: dataclasses.asdict(stats.bootstrap(now)),
                    "gain": dataclasses.asdict(stats.paired_difference(now, was))}
    return out
