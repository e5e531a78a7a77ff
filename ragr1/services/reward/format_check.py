"""The format reward: does the response follow think, (search, information, think)*, answer?

Four checks, each worth a configurable weight; the format score is the weighted share passed:

- ``tags``: every tag is closed, none nested, no stray closing tag;
- ``order``: the segments run ``think (search information think)* answer`` (Search-R1's state
  machine: a think before every search and before the answer, information only after a search);
- ``answer``: a closed ``<answer>`` exists;
- ``clean``: nothing but white space outside the segments, nothing after the answer, and no turn that
  held neither a search nor an answer. Search-R1's ``is_valid_sequence`` reads the whole response, the
  inserted "My previous action is invalid" feedback included, and rejects that feedback as text between
  tags; here the feedback is never parsed (it quotes the tags), so the turns it answered are counted instead.

A response is *valid* (Search-R1's ``is_valid_sequence``) when all four pass.
"""

from __future__ import annotations

import dataclasses
import re

from ragr1.protocol.grammar import ParsedResponse
from ragr1.services.common.config import Validated, setting

_ORDER = re.compile(r"t(sit)*a")


@dataclasses.dataclass(frozen=True)
class FormatWeights(Validated):
    """How much each check counts in the format score (the reward's ``format_weights`` section)."""

    tags: float = setting(0.25, "weight of 'tags closed, none nested'")
    order: float = setting(0.25, "weight of 'think (search information think)* answer'")
    answer: float = setting(0.25, "weight of 'a closed <answer> exists'")
    clean: float = setting(0.25, "weight of 'no text outside tags or after the answer, no invalid-action turn'")

    def validate(self) -> None:
        super().validate()
        values = dataclasses.astuple(self)
        if any(w < 0 for w in values) or sum(values) <= 0:
            raise ValueError(f"format weights must be >= 0 with a positive sum, got {self}")


@dataclasses.dataclass(frozen=True)
class FormatResult:
    score: float
    valid: bool
    reasons: tuple[str, ...]


def check_format(parsed: ParsedResponse, weights: FormatWeights | None = None) -> FormatResult:
    weights = weights or FormatWeights()
    reasons: list[str] = list(dict.fromkeys(parsed.errors))
    has_answer = parsed.answer is not None
    if not has_answer:
        reasons.append("no_answer_tag")
    ordered = _ORDER.fullmatch(parsed.tag_sequence()) is not None
    if not ordered:
        reasons.append("bad_tag_order")
    if parsed.text_outside_tags:
        reasons.append("text_outside_tags")
    if parsed.text_after_answer:
        reasons.append("text_after_answer")
    if parsed.invalid_actions:
        reasons.append("invalid_action")
    checks = {
        "tags": not parsed.errors,
        "order": ordered,
        "answer": has_answer,
        "clean": not (parsed.text_outside_tags or parsed.text_after_answer or parsed.invalid_actions),
    }
    total = sum(dataclasses.astuple(weights))
    score = sum(getattr(weights, name) for name, passed in checks.items() if passed) / total
    return FormatResult(score=score, valid=all(checks.values()), reasons=tuple(reasons))
