"""The demo's stage-to-stage gains: each stage's evaluation (``StageResult``) against the one before, paired
question by question, and SFT -> RL on the more held-out questions; never between stages evaluated under
another corpus or retriever (``evaluate.incomparable``). And each stage's evaluation by mode and question type
(``type_rows``): where multi-query search pays is a matter of the question's type (comparison questions)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from ragr1.shipped import BRIDGE, COMPARISON, QUESTION_TYPES
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


# A record whose question type is not known ("" in ``evaluate.rollout_record``) is counted under this name.
UNKNOWN_TYPE = "unknown"
TYPE_HEADER = ["stage", "mode", "question type", "n", "EM [95% CI]", "rounds", "queries/round",
               "s/question (trajectory)"]


def _type_row(stage: str, mode: str, question_type: str, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rounds = sum(int(r["retrieval_rounds"]) for r in records)
    queries = sum(int(r["queries"]) for r in records)
    return {
        "stage": stage, "mode": mode, "question_type": question_type, "questions": len(records),
        "exact_match": dataclasses.asdict(stats.bootstrap([float(r["exact_match"]) for r in records])),
        "retrieval_rounds": rounds / len(records),
        # Every query of these questions over every round they searched in; None where none searched.
        "queries_per_round": queries / rounds if rounds else None,
        "seconds_per_question": sum(float(r["seconds"]) for r in records) / len(records),
    }


def type_rows(stages: Sequence[StageResult]) -> list[dict[str, Any]]:
    """One row per stage, search mode and question type, the sources pooled: the questions, EM with its 95%
    bootstrap interval, retrieval rounds per question, queries per round, and the trajectories' own seconds
    per question (generating and retrieving, ``evaluate.rollout_record``'s ``seconds``). The more held-out
    questions' rows are the stage's ``(more)`` rows, as in the demo's table. Modes and types in their usual
    order (``EVAL_MODES``, ``QUESTION_TYPES``), others after them."""
    modes = {mode: i for i, mode in enumerate(EVAL_MODES)}
    types = {kind: i for i, kind in enumerate(QUESTION_TYPES)}
    rows = []
    for stage in stages:
        for name, records in ((stage.stage, stage.records), (f"{stage.stage} (more)", stage.gain_records)):
            groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for r in records:
                groups.setdefault((r["mode"], r.get("question_type") or UNKNOWN_TYPE), []).append(r)
            order = sorted(groups, key=lambda k: (modes.get(k[0], len(modes)), types.get(k[1], len(types)), k))
            rows += [_type_row(name, mode, kind, groups[mode, kind]) for mode, kind in order]
    return rows


def type_table(rows: Sequence[dict[str, Any]]) -> str:
    """``type_rows`` as a table for the terminal, in the style of the demo's table by source."""
    return evaluate.format_table([
        [r["stage"], r["mode"], r["question_type"], str(r["questions"]), str(stats.Estimate(**r["exact_match"])),
         f"{r['retrieval_rounds']:.2f}", "-" if r["queries_per_round"] is None else f"{r['queries_per_round']:.2f}",
         f"{r['seconds_per_question']:.2f}"] for r in rows
    ], TYPE_HEADER)


# Question groups of the multi- against single-query comparison: every question, the multi-hop ones (where RAG-R1
# claims fewer rounds), then each type.
MODE_GROUPS = ("all", "multi-hop", *QUESTION_TYPES)
MULTI_HOP = frozenset({BRIDGE, COMPARISON})


def _in_group(record: dict[str, Any], group: str) -> bool:
    kind = record.get("question_type") or UNKNOWN_TYPE
    return group == "all" or (group == "multi-hop" and kind in MULTI_HOP) or kind == group


def mode_differences(stages: Sequence[StageResult]) -> list[dict[str, Any]]:
    """Per stage and question group (``MODE_GROUPS``), multi- against single-query mode on the same questions:
    each mode's retrieval rounds per question and EM, and the paired difference multi - single of each with
    its 95% interval. RAG-R1's claim is fewer rounds (an interval below 0) at an EM not lower."""
    out = []
    for stage in stages:
        for group in MODE_GROUPS:
            mine = [r for r in stage.records if _in_group(r, group)]
            row: dict[str, Any] = {"stage": stage.stage, "questions": group}
            for key in ("retrieval_rounds", "exact_match"):
                single, multi = (paired_scores(mine, key, mode=mode) for mode in ("single", "multi"))
                if not single or len(single) != len(multi):
                    break
                row["n"] = len(single)
                row[key] = {"single": sum(single) / len(single), "multi": sum(multi) / len(multi),
                            "difference": dataclasses.asdict(stats.paired_difference(multi, single))}
            else:
                out.append(row)
    return out


def mode_lines(rows: Sequence[dict[str, Any]]) -> str:
    """``mode_differences`` for the terminal."""
    lines = []
    for r in rows:
        rounds, em = r["retrieval_rounds"], r["exact_match"]
        lines.append(
            f"{r['stage']:>4} {r['questions']:<10} n {r['n']:>3}: rounds single {rounds['single']:.2f}, multi "
            f"{rounds['multi']:.2f}, multi - single {stats.Estimate(**rounds['difference'])}; EM single "
            f"{em['single']:.3f}, multi {em['multi']:.3f}, multi - single {stats.Estimate(**em['difference'])}")
    return "\n".join(lines)
