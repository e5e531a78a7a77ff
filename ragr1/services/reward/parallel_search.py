"""ParallelSearch's reward (arXiv 2508.09303), the ``parallel_search`` scheme, after the authors' released
scorer (``verl/utils/reward_score/qa_em_format.py::compute_score_em`` in Tree-Shu-Zhao/ParallelSearch, with
the constants of its ``train_parallelsearch.sh``). Per trajectory, with the question's class (their
``is_comp``: 1 comparison, 0 bridge, -1 single-hop):

- correctness and format, Search-R1 v0.3's rule with ParallelSearch's values: right answer 1 in a valid
  format, 1 - ``format_score`` in an invalid one; wrong answer ``format_score`` if valid, else
  ``invalid_answer_score``; no answer 0 (a response without an answer is never valid, here or there);
- decomposition, c = ``comp_score``: 3c when a comparison question's first search holds two or more queries,
  c when another question's first search holds one (or there is no search), else 0;
- search count, s = ``count_score``, S = the model's searches: s - |S - 1| s for comparison and single-hop
  questions (one search is best), s - |min(S, 2) - 2| s for bridge questions (two or more are best). Not
  clipped at 0, as theirs is not: each search past the best costs s.

Adapted to this project's format:

- their sub-queries are joined by "##" inside one ``<search>`` and a search is decomposed when it holds one;
  here they are the multi-query mode's queries, cut at the separator by the loop's own rule
  (``grammar.split_queries``), and a search is decomposed when that gives two or more (their "a ##" counts,
  a trailing "a," here does not: the loop searches it as one query);
- their count, ``solution_str.count("<search>")``, also counts the two "<search>" of the prompt's
  instructions (their targets are 3 and 4) and the one each invalid-action feedback quotes; here S counts the
  model's own closed ``<search>`` segments (inserted passages and feedback are never read; an invalid turn
  costs through the format check), and the targets are 1 and 2;
- their valid format is Search-R1's ``is_valid_sequence``; here ``format_check``'s ``valid`` (all four checks
  pass), the same state machine read on what the model generated;
- their class comes from the data row's ``extra_info.type`` (their NQ rows are typed "na", -1; a row
  with no type at all gets 0 in their loader); here from the task's ``question_type``
  (``shipped.question_type``, from the data files' labels), an unknown type taken as their "na". Every shipped
  training question has a type; the untyped are evaluation files', whose rewards train nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ragr1.protocol.grammar import split_queries
from ragr1.protocol.prompts import QUERY_SEPARATOR
from ragr1.services.common.config import Validated, setting
from ragr1.shipped import BRIDGE, COMPARISON, SINGLE_HOP

# Their is_comp: comparison questions are the ones whose first search should be decomposed; bridge questions
# need a second search for what the first passage names; the rest (their "na") one search, kept whole.
_CLASSES = {COMPARISON: 1, BRIDGE: 0, SINGLE_HOP: -1, "": -1}
# Theirs: a decomposed comparison earns three times what a whole search of another question does.
_COMPARISON_FACTOR = 3


@dataclasses.dataclass(frozen=True)
class ParallelSearchSettings(Validated):
    """ParallelSearch's constants (the reward's ``parallel_search`` section); defaults: its training script's."""

    comp_score: float = setting(
        0.15, "decomposition reward c (ParallelSearch's comp_score, 0.15): 3c when a comparison question's first "
        "search holds 2+ queries, c when another question's holds one or there is no search"
    )
    count_score: float = setting(
        0.35, "search-count reward s (ParallelSearch's count_score, 0.35), S the model's searches: s - |S - 1| s "
        "for comparison and single-hop questions, s - |min(S, 2) - 2| s for bridge ones"
    )
    format_score: float = setting(
        0.1, "ParallelSearch's structure_format_score (0.1): paid for a valid format without the right answer, "
        "taken off a right answer in an invalid format"
    )
    invalid_answer_score: float = setting(
        0.0, "ParallelSearch's final_format_score (0.0): paid for a wrong answer in an invalid format"
    )

    def validate(self) -> None:
        super().validate()
        negative = {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) < 0}
        if negative:
            raise ValueError(f"parallel_search scores must be >= 0, got {negative}")


def known_type(question_type: str) -> bool:
    return question_type.strip().lower() in _CLASSES


def question_class(question_type: str) -> int:
    """Their ``is_comp`` of a question type: 1, 0 or -1 (a type this project does not know too)."""
    return _CLASSES.get(question_type.strip().lower(), _CLASSES[""])


def outcome(weights: ParallelSearchSettings, em: float, valid: bool, has_answer: bool) -> float:
    """Correctness and format."""
    if not has_answer:
        return weights.format_score if valid else 0.0
    if em == 1.0:
        return 1.0 if valid else 1.0 - weights.format_score
    return weights.format_score if valid else weights.invalid_answer_score


def decomposition(weights: ParallelSearchSettings, searches: Sequence[str], klass: int) -> float:
    """``searches``: the contents of the model's ``<search>`` segments, in order."""
    decomposed = bool(searches) and len(split_queries(searches[0], QUERY_SEPARATOR)) >= 2
    if klass > 0 and decomposed:
        return _COMPARISON_FACTOR * weights.comp_score
    if klass <= 0 and not decomposed:
        return weights.comp_score
    return 0.0


def search_count(weights: ParallelSearchSettings, searches: int, klass: int) -> float:
    s = weights.count_score
    if klass != 0:
        return s - abs(searches - 1) * s
    return s - abs(min(searches, 2) - 2) * s
