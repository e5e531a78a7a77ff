"""The demo's questions: held-out evaluation questions and disjoint training questions, whose supporting
passages are all in the index the stack serves (so that retrieval can find them).

Multi-hop questions only (HotpotQA, MuSiQue), and no yes/no comparison questions: a constant answer
must not be able to score (PopQA's occupation questions let "politician" score EM 0.25)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ragr1.data import read_jsonl, train_path
from ragr1.stack.stats import is_yes_no

# Multi-hop questions, where several queries at once pay off.
SOURCES = ("hotpotqa", "musique")


@dataclasses.dataclass
class Split:
    eval: list[dict[str, Any]]
    train: list[dict[str, Any]]
    # RL prompts: questions neither SFT nor evaluation saw, the sources taking turns, so that every
    # update's few prompts mix them (the trainer takes prompts in file order).
    rl: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def passage_ids(self) -> set[str]:
        """Every paragraph of every question (gold and distractors): the demo's index slice."""
        return {p["pid"] for r in (*self.eval, *self.train, *self.rl) for p in r["paragraphs"] if p.get("pid")}


def split_questions(eval_per_source: int, train_per_source: int, allowed: set[str] | None = None,
                    sources: Sequence[str] = SOURCES, rl_per_source: int = 0) -> Split:
    """The first questions of each training file go to evaluation, the next to training (SFT), the next to
    RL; yes/no questions are left out.

    ``allowed`` (passage ids) keeps only questions whose supporting passages are all in it.
    """
    split = Split([], [])
    rl_by_source = []
    wanted = eval_per_source + train_per_source + rl_per_source
    for source in sources:
        kept = []
        for record in read_jsonl(train_path(source)):
            gold = {p.get("pid") for p in record.get("paragraphs", []) if p.get("is_supporting")}
            if is_yes_no(record["golden_answers"]):
                continue
            if allowed is None or (gold and gold <= allowed):
                kept.append(record)
            if len(kept) == wanted:
                break
        if len(kept) < wanted:
            raise ValueError(f"{source}: only {len(kept)} usable questions (no yes/no, passages in the index); "
                             f"asked for {eval_per_source} + {train_per_source} + {rl_per_source}")
        split.eval += kept[:eval_per_source]
        split.train += kept[eval_per_source:eval_per_source + train_per_source]
        rl_by_source.append(kept[eval_per_source + train_per_source:])
    split.rl = [r for turn in zip(*rl_by_source, strict=True) for r in turn]
    return split


def write_jsonl(records: Iterable[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
