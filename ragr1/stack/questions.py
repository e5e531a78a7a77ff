"""The demo's questions: held-out evaluation questions and disjoint training questions, whose supporting
passages are all in the index the stack serves (so that retrieval can find them).

``split_questions`` defaults to multi-hop questions (HotpotQA, MuSiQue); RL may add single-hop ones
(PopQA's birthplaces), as RAG-R1 adds NQ, and the demo evaluates on PopQA's birthplaces and HotpotQA (held
out), so that RL is measured on the distributions it trains on. No yes/no comparison questions and no
``CONSTANT_PRONE`` types: a constant answer must not be able to score.

Each record keeps its data set's fields and gains ``question_type`` (``shipped.question_type``), so that the
files the demo writes, and the tasks and rollouts read from them, carry it. Each source's questions take
turns by question type before they are split (``balanced``): most of HotpotQA's comparison questions are
yes/no ones, left out, so in file order the few left would give the held-out set few of the questions where
parallel queries pay."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ragr1.shipped import question_type, read_jsonl, train_path
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
    # More held-out questions, after RL's, for one comparison: SFT -> RL in the mode RL trains. Every mode's
    # evaluation after every stage can afford few questions; one mode after two stages can afford more.
    gain: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def passage_ids(self) -> set[str]:
        """Every paragraph of every question (gold and distractors): the demo's index slice."""
        return {p["pid"] for r in (*self.eval, *self.train, *self.rl, *self.gain) for p in r["paragraphs"]
                if p.get("pid")}


# Question types a constant answers too often to be a reward worth learning: a policy paid for PopQA's
# occupation questions learns to say "politician" (EM 0.25 on them, with no search).
CONSTANT_PRONE = {"popqa": {"occupation"}}


def _usable(source: str, allowed: set[str] | None) -> Iterator[dict[str, Any]]:
    """The source's questions in file order, without yes/no or constant-prone ones, and (with ``allowed``,
    passage ids) only those whose supporting passages are all in it."""
    for record in read_jsonl(train_path(source)):
        gold = {p.get("pid") for p in record.get("paragraphs", []) if p.get("is_supporting")}
        if is_yes_no(record["golden_answers"]) or record.get("type") in CONSTANT_PRONE.get(source, ()):
            continue
        if allowed is None or (gold and gold <= allowed):
            yield record | {"question_type": question_type(record, source)}


def balanced(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records taking turns by ``question_type`` (types in the order of their first record, each type's
    records in file order; once a type runs out, the others go on taking turns): deterministic, and any
    first n of them as evenly spread over the types as the records allow."""
    by_type: dict[str, collections.deque[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(record["question_type"], collections.deque()).append(record)
    out: list[dict[str, Any]] = []
    queues = list(by_type.values())
    while queues:
        out += [queue.popleft() for queue in queues]
        queues = [queue for queue in queues if queue]
    return out


def split_questions(eval_per_source: int, train_per_source: int, allowed: set[str] | None = None,
                    sources: Sequence[str] = SOURCES, rl_per_source: int = 0,
                    rl_sources: Sequence[str] | None = None, gain_per_source: int = 0,
                    balance_types: bool = True) -> Split:
    """The first usable questions of each training file go to evaluation, the next to training (SFT), the
    next to RL, the next (``gain_per_source`` of each of ``sources``) to the more held-out questions of
    ``Split.gain``. ``rl_sources`` (default: ``sources``) may name other files for RL, as RAG-R1 mixes NQ's
    single-hop questions into its RL set; a file in both gives RL the questions after SFT's.

    With ``balance_types`` each file's usable questions are first put in turns by question type
    (``balanced``: HotpotQA's bridge and comparison questions alternate, so that every part holds both); a
    file of one type (MuSiQue's chains, PopQA's birthplaces) keeps its order. Without, file order.
    """
    split = Split([], [])
    rl_sources = list(sources if rl_sources is None else rl_sources)
    rl_by_source = []
    for source in dict.fromkeys([*sources, *rl_sources]):
        first = eval_per_source + train_per_source if source in sources else 0
        rl = rl_per_source if source in rl_sources else 0
        gain = gain_per_source if source in sources else 0
        usable = balanced(_usable(source, allowed)) if balance_types else _usable(source, allowed)
        kept = list(itertools.islice(usable, first + rl + gain))
        if len(kept) < first + rl + gain:
            raise ValueError(f"{source}: only {len(kept)} usable questions (no yes/no, passages in the index); "
                             f"asked for {first} (evaluation and SFT) + {rl} (RL) + {gain} (more held-out)")
        if first:
            split.eval += kept[:eval_per_source]
            split.train += kept[eval_per_source:first]
        if rl:
            rl_by_source.append(kept[first:first + rl])
        split.gain += kept[first + rl:]
    split.rl = [r for turn in zip(*rl_by_source, strict=True) for r in turn]
    return split


def write_jsonl(records: Iterable[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
