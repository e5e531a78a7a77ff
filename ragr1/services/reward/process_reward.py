"""The retrieval-process reward (R3-RAG's idea): did each search round find gold evidence?

A round found evidence when one of its passages contains a gold answer (normalised, whole words) or
its title is a gold supporting title. The process score is the mean over rounds of

    (1 - relevance_weight) * evidence + relevance_weight * relevance

where relevance is the best score a ``RelevanceScorer`` gives a (round's queries, passage) pair.
The built-in scorer is lexical; a cross-encoder or judge model plugs in behind the same Protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from ragr1.protocol.information import Passage
from ragr1.services.reward.answers import contains_answer, normalize_answer


@dataclasses.dataclass(frozen=True)
class Round:
    """One search round: what the model asked (the ``<search>`` content) and what came back."""

    query: str
    passages: Sequence[Passage]


class RelevanceScorer(Protocol):
    """Scores how relevant each passage is to a query, each score in [0, 1]."""

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]: ...


class LexicalRelevance:
    """Share of the query's normalised words that the passage (title and text) contains."""

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]:
        wanted = set(normalize_answer(query).split())
        if not wanted:
            return [0.0] * len(passages)
        out = []
        for passage in passages:
            words = set(normalize_answer(f"{passage.title} {passage.text}").split())
            out.append(len(wanted & words) / len(wanted))
        return out


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    score: float
    rounds: int
    rounds_with_evidence: int
    reasons: tuple[str, ...]


def process_score(
    rounds: Sequence[Round],
    golds: Sequence[str],
    supporting_titles: Sequence[str],
    relevance_weight: float = 0.0,
    scorer: RelevanceScorer | None = None,
) -> ProcessResult:
    """``golds`` are normalised answer aliases; titles are compared after normalisation too."""
    if not rounds:
        return ProcessResult(0.0, 0, 0, ("no_search",))
    titles = {normalize_answer(t) for t in supporting_titles} - {""}
    if not golds and not titles:
        return ProcessResult(0.0, len(rounds), 0, ("missing_gold",))
    found = 0
    total = 0.0
    for rnd in rounds:
        evidence = any(
            normalize_answer(p.title) in titles or contains_answer(normalize_answer(p.text), golds)
            for p in rnd.passages
        )
        found += evidence
        value = float(evidence)
        if relevance_weight > 0 and scorer is not None and rnd.passages:
            relevance = max(scorer.score(rnd.query, rnd.passages))
            value = (1.0 - relevance_weight) * value + relevance_weight * relevance
        total += value
    reasons = ("no_gold_evidence",) if found < len(rounds) else ()
    return ProcessResult(total / len(rounds), len(rounds), found, reasons)
