"""Scoring a batch of trajectories: outcome, format and process parts, and their composition.

The outcome looks only at what the model generated. Callers that know who wrote what (the rollout
workers) send the response as spans, and only the generated ones are parsed as actions: the passages
and the invalid-action feedback the system inserted, which quote the tags, are never read as a search
or an answer. A response sent as one text is parsed with its ``<information>`` blocks opaque.

The outcome looks only at the response (everything after the prompt). Search-R1's scorer reads the
prompt too and, when the response has no answer, takes the example ``<answer>`` of the prompt's
instructions (it asks for a second match to work around that); here the prompt never reaches the
scorer, and a caller that sends the whole chat anyway is caught: only what follows the last
``assistant_marker`` is scored, with the reason "prompt_in_response".

Bad input gets a defined score and a counted reason, never an exception: an empty response, a
response over ``ScoreLimits.max_response_chars`` (all parts 0, "response_too_long": one runaway
trajectory must not fail its whole batch), missing gold answers (EM and F1 0 and the total 0 in every
scheme, "missing_gold"), a question type this project does not know (taken as unknown,
"unknown_question_type"), lone surrogates (replaced, "invalid_unicode"). What makes the *request*
malformed (too many items, retrieved_rounds not matching retrieved, a round number over the limit)
raises ``InvalidArgument``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Self

from ragr1.protocol.grammar import ParsedResponse, Span, parse_response, parse_spans
from ragr1.protocol.information import Passage
from ragr1.services.common.config import Validated, check_at_least, check_choice, section, setting
from ragr1.services.common.errors import InvalidArgument
from ragr1.services.reward import parallel_search
from ragr1.services.reward.answers import exact_match, normalized_golds, token_f1
from ragr1.services.reward.format_check import FormatWeights, check_format
from ragr1.services.reward.parallel_search import ParallelSearchSettings
from ragr1.services.reward.process_reward import RelevanceScorer, Round, process_score

SCHEMES = ("weighted", "search_r1_v03", "parallel_search")


@dataclasses.dataclass(frozen=True)
class RetrievedPassage:
    title: str
    text: str
    round: int


@dataclasses.dataclass(frozen=True)
class ScoreInput:
    # The response as one text; ignored when ``spans`` are given.
    response: str = ""
    golden_answers: Sequence[str] = ()
    supporting_titles: Sequence[str] = ()
    # Empty: the rounds are read from the response's <information> blocks instead.
    retrieved: Sequence[RetrievedPassage] = ()
    id: str = ""
    # The response as pieces with who wrote each (generated, information, feedback), in order.
    spans: Sequence[Span] = ()
    # The task's question type (``shipped.QUESTION_TYPES``, "" unknown): ParallelSearch's parts depend on it.
    question_type: str = ""


@dataclasses.dataclass(frozen=True)
class Parts:
    total: float = 0.0
    exact_match: float = 0.0
    f1: float = 0.0
    format: float = 0.0
    process: float = 0.0
    decomposition: float = 0.0
    search_count: float = 0.0
    extracted_answer: str = ""
    reasons: tuple[str, ...] = ()


@dataclasses.dataclass
class Composition(Validated):
    """How the parts make the total.

    ``weighted``: total = em_weight * EM + f1_weight * F1 + format_weight * format
    + process_weight * process.

    ``search_r1_v03``: Search-R1's v0.3 reward, with a valid format meaning all format checks pass:
    correct answer: 1 if valid else 1 - structure_format_score; otherwise, valid: structure_format_score
    (+ retrieval_score if some round found gold evidence); invalid with an answer: final_format_score;
    no answer: 0.

    ``parallel_search``: ParallelSearch's reward (``parallel_search.py``): correctness and format with its
    values, plus its decomposition and search-count parts, which depend on the question's type.
    """

    scheme: str = setting(
        "weighted", f"how the parts make the total: {' | '.join(SCHEMES)} (Search-R1's v0.3 reward, "
        "ParallelSearch's)"
    )
    # RAG-R1's outcome reward: exact match alone.
    em_weight: float = setting(1.0, "weighted scheme: weight of exact match")
    f1_weight: float = setting(0.0, "weighted scheme: weight of token F1")
    format_weight: float = setting(0.0, "weighted scheme: weight of the format score")
    process_weight: float = setting(0.0, "weighted scheme: weight of the retrieval-process score")
    # Search-R1 v0.3's training scripts' values.
    structure_format_score: float = setting(0.2, "search_r1_v03: reward of a valid format with a wrong answer")
    final_format_score: float = setting(0.1, "search_r1_v03: reward of an answer in an invalid format")
    retrieval_score: float = setting(
        0.0, "search_r1_v03: bonus of a valid format whose retrieval found gold evidence"
    )
    parallel_search: ParallelSearchSettings = section(
        ParallelSearchSettings, "parallel_search scheme: ParallelSearch's constants, by default its training script's"
    )

    def validate(self) -> None:
        super().validate()
        check_choice("scheme", self.scheme, SCHEMES)

    @classmethod
    def search_r1_v03(cls) -> Self:
        """Search-R1's v0.3 reward, with its training scripts' values (the defaults)."""
        return cls(scheme="search_r1_v03")

    def total(self, em: float, f1: float, fmt: float, process: float, valid: bool,
              has_answer: bool, evidence: bool, searches: tuple[float, float]) -> float:
        """``searches``: ParallelSearch's decomposition and search-count parts (only its scheme adds them)."""
        if self.scheme == "weighted":
            return (self.em_weight * em + self.f1_weight * f1 + self.format_weight * fmt
                    + self.process_weight * process)
        if self.scheme == "parallel_search":
            return parallel_search.outcome(self.parallel_search, em, valid, has_answer) + sum(searches)
        if em == 1.0:
            return 1.0 if valid else 1.0 - self.structure_format_score
        if valid:
            return self.structure_format_score + (self.retrieval_score if evidence else 0.0)
        return self.final_format_score if has_answer else 0.0


@dataclasses.dataclass
class ScoreLimits(Validated):
    max_items: int = setting(4096, "most trajectories in one Score call (more: INVALID_ARGUMENT)")
    max_response_chars: int = setting(
        200_000, "longest response scored; longer ones score 0 with reason response_too_long"
    )
    max_rounds: int = setting(64, "largest retrieved_rounds value + 1 (more: INVALID_ARGUMENT)")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_items", 1), ("max_response_chars", 1), ("max_rounds", 1)))


@dataclasses.dataclass
class RewardSettings(Composition, ScoreLimits):
    """Everything the scorer reads (the reward server's config is one)."""

    format_weights: FormatWeights = section(FormatWeights, "format score: the weight of each of its checks")
    relevance_weight: float = setting(
        0.0, "process score: share given to the lexical relevance of the passages (rest: gold evidence)"
    )
    # ChatML's (Qwen2.5, SmolLM2).
    assistant_marker: str = setting(
        "<|im_start|>assistant",
        "start of the model's turn in the chat template; a response holding it is scored only after "
        "its last occurrence (reason prompt_in_response); empty: off",
    )

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.relevance_weight <= 1.0:
            raise ValueError(f"relevance_weight must be in [0, 1], got {self.relevance_weight}")


def check_batch_size(count: int, limits: ScoreLimits) -> None:
    if count > limits.max_items:
        raise InvalidArgument(f"items: {count} items in one request, the limit is {limits.max_items}")


def validate(items: Sequence[ScoreInput], limits: ScoreLimits) -> None:
    """Raises InvalidArgument, naming the field and the limit, for what makes a request malformed."""
    check_batch_size(len(items), limits)
    for index, item in enumerate(items):
        for passage in item.retrieved:
            if not 0 <= passage.round < limits.max_rounds:
                raise InvalidArgument(
                    f"items[{index}].retrieved_rounds: round {passage.round} is outside "
                    f"[0, {limits.max_rounds})"
                )


def _clean(text: str) -> tuple[str, bool]:
    """Replaces each lone surrogate (which cannot be encoded) by one U+FFFD; True if there were any.

    Through UTF-16, a surrogate *pair* left split in a Python string is joined into its character.
    """
    if text.isascii():
        return text, False
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace"), True


def _rounds(item: ScoreInput, queries: list[str], information: list[str]) -> list[Round]:
    """Round i is the i-th <search> with the passages of round i: from ``item.retrieved`` when given,
    else the i-th <information> block as one passage. A search that got nothing is a round too."""
    if item.retrieved:
        grouped: list[list[Passage]] = [[] for _ in range(1 + max(p.round for p in item.retrieved))]
        for p in item.retrieved:
            grouped[p.round].append(Passage("", p.title, p.text))
    else:
        grouped = [[Passage("", "", block)] for block in information]
    count = max(len(queries), len(grouped))
    return [
        Round(queries[i] if i < len(queries) else "", grouped[i] if i < len(grouped) else [])
        for i in range(count)
    ]


class RewardScorer:
    """Scores trajectories with fixed settings; ``scorer`` is the optional relevance model."""

    def __init__(self, settings: RewardSettings | None = None, scorer: RelevanceScorer | None = None):
        self.settings = settings or RewardSettings()
        self.scorer = scorer

    def score_batch(self, items: Sequence[ScoreInput]) -> list[Parts]:
        validate(items, self.settings)
        return [self.score(item) for item in items]

    def _parse(self, item: ScoreInput) -> tuple[ParsedResponse | None, list[str]]:
        """The parsed response and the reasons met on the way; None (with the reason) for no response."""
        settings = self.settings
        texts = [s.text for s in item.spans] if item.spans else [item.response]
        if not "".join(texts).strip():
            return None, ["empty_response"]
        if sum(len(t) for t in texts) > settings.max_response_chars:
            return None, ["response_too_long"]
        cleaned = [_clean(t) for t in texts]
        reasons: list[str] = []
        if any(repaired for _, repaired in cleaned):
            reasons.append("invalid_unicode")
        elif any("\ufffd" in t for t, _ in cleaned):
            reasons.append("replacement_char")
        if item.spans:
            spans = [Span(text, s.kind) for (text, _), s in zip(cleaned, item.spans, strict=True)]
            return parse_spans(spans), reasons
        response = cleaned[0][0]
        marker = settings.assistant_marker
        if marker and marker in response:
            response = response[response.rindex(marker) + len(marker) :]
            reasons.append("prompt_in_response")
        return parse_response(response), reasons

    def score(self, item: ScoreInput) -> Parts:
        settings = self.settings
        parsed, reasons = self._parse(item)
        if parsed is None:
            return Parts(reasons=tuple(reasons))
        fmt = check_format(parsed, settings.format_weights)
        reasons += fmt.reasons
        answer = parsed.answer
        golds = normalized_golds([_clean(g)[0] for g in item.golden_answers])
        em = f1 = 0.0
        if not golds:
            reasons.append("missing_gold")
        elif answer is not None:
            em, f1 = exact_match(answer, golds), token_f1(answer, golds)
            if not answer:
                reasons.append("empty_answer")
            elif em == 0.0:
                reasons.append("wrong_answer")

        searches = parsed.contents("search")
        if not parallel_search.known_type(item.question_type):
            reasons.append("unknown_question_type")
        klass = parallel_search.question_class(item.question_type)
        # Computed under every scheme, as the other parts are: a run under exact match still shows how it searched.
        decomposition = parallel_search.decomposition(settings.parallel_search, searches, klass)
        count = parallel_search.search_count(settings.parallel_search, len(searches), klass)
        rounds = _rounds(item, searches, parsed.contents("information"))
        titles = [_clean(t)[0] for t in item.supporting_titles]
        proc = process_score(rounds, golds, titles, settings.relevance_weight, self.scorer)
        reasons += proc.reasons
        # Without gold the outcome is unknown: the total stays 0 (the trainer must not learn from a
        # data error), while the format and process parts are still reported.
        total = 0.0 if not golds else settings.total(
            em, f1, fmt.score, proc.score, fmt.valid, answer is not None, proc.rounds_with_evidence > 0,
            (decomposition, count),
        )
        return Parts(
            total=total,
            exact_match=em,
            f1=f1,
            format=fmt.score,
            process=proc.score,
            decomposition=decomposition,
            search_count=count,
            extracted_answer=answer or "",
            reasons=tuple(dict.fromkeys(reasons)),
        )
