"""The composed reward over whole trajectories: process reward on real questions, the schemes, bad input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragr1.protocol.grammar import Span, SpanKind
from ragr1.protocol.information import Passage
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK
from ragr1.services.common.errors import InvalidArgument
from ragr1.services.reward.process_reward import LexicalRelevance, Round, process_score
from ragr1.services.reward.scoring import (
    Composition,
    RetrievedPassage,
    RewardScorer,
    RewardSettings,
    ScoreInput,
)
from ragr1.shipped import read_jsonl, train_path


def _question() -> dict[str, Any]:
    """A real HotpotQA question whose gold answer is not in its distractor paragraphs."""
    for record in read_jsonl(train_path("hotpotqa")):
        gold = record["golden_answers"][0].lower()
        distractors = [p for p in record["paragraphs"] if not p["is_supporting"]]
        if all(gold not in p["text"].lower() for p in distractors) and len(distractors) >= 2:
            return record
    raise AssertionError("no suitable question in the shipped data")


def _trajectory(answer: str, rounds: int = 2) -> str:
    steps = "".join(
        f"<think>step {i}</think><search>query {i}</search><information>Doc {i}</information>"
        for i in range(rounds)
    )
    return f"{steps}<think>done</think><answer>{answer}</answer>"


def _passages(record: dict[str, Any], supporting_round: int | None) -> list[RetrievedPassage]:
    """Round 0 and 1 get two distractors each; ``supporting_round`` also gets the gold paragraphs."""
    distractors = [p for p in record["paragraphs"] if not p["is_supporting"]]
    out = [RetrievedPassage(p["title"], p["text"], r) for r in (0, 1) for p in distractors[2 * r : 2 * r + 2]]
    if supporting_round is not None:
        out += [RetrievedPassage(p["title"], p["text"], supporting_round)
                for p in record["paragraphs"] if p["is_supporting"]]
    return out


def test_process_reward_on_a_real_question() -> None:
    record = _question()
    gold = record["golden_answers"]
    titles = record["supporting_titles"]
    scorer = RewardScorer()
    response = _trajectory(gold[0])
    found = scorer.score(ScoreInput(response, gold, titles, _passages(record, supporting_round=1)))
    assert found.process == 0.5  # round 1 of 2 found gold evidence
    assert "no_gold_evidence" in found.reasons
    missed = scorer.score(ScoreInput(response, gold, titles, _passages(record, None)))
    assert missed.process == 0.0
    # titles alone are evidence too (e.g. for questions whose answer is "yes")
    by_title = scorer.score(ScoreInput(_trajectory("x"), [], titles, _passages(record, supporting_round=0)))
    assert by_title.process == 0.5


def test_process_reward_from_information_blocks() -> None:
    """Without structured passages, each <information> block is one round."""
    response = (
        "<think>a</think><search>capital of France</search><information>Doc 1(Title: Lyon) Lyon is a city."
        "</information><think>b</think><search>France capital</search><information>Doc 1(Title: Paris) "
        "Paris is the capital of France.</information><think>c</think><answer>Paris</answer>"
    )
    parts = RewardScorer().score(ScoreInput(response, ["Paris"]))
    assert parts.process == 0.5


def test_search_rounds_without_passages_count_as_misses() -> None:
    record = _question()
    retrieved = [p for p in _passages(record, supporting_round=0) if p.round == 0]
    parts = RewardScorer().score(
        ScoreInput(_trajectory("x", rounds=3), record["golden_answers"], [], retrieved)
    )
    assert parts.process == pytest.approx(1 / 3)


def test_a_search_left_without_information_is_a_missed_round() -> None:
    response = (
        "<think>a</think><search>capital of France</search><information>Paris is the capital.</information>"
        "<think>b</think><search>more</search>"
    )
    parts = RewardScorer().score(ScoreInput(response, ["Paris"]))
    assert parts.process == 0.5


def test_lexical_relevance_mixes_into_the_process_score() -> None:
    rounds = [Round("capital of France", [Passage("", "Paris", "Paris is the capital of France.")]),
              Round("Eiffel tower height", [Passage("", "Bread", "Baguettes are long.")])]
    plain = process_score(rounds, ["paris"], [], relevance_weight=0.0, scorer=LexicalRelevance())
    mixed = process_score(rounds, ["paris"], [], relevance_weight=0.5, scorer=LexicalRelevance())
    assert plain.score == 0.5
    # round 0: 0.5 * 1 + 0.5 * 1 (all query words found); round 1: 0
    assert mixed.score == pytest.approx(0.5)
    assert LexicalRelevance().score("capital of France", [Passage("", "", "France")]) == [pytest.approx(1 / 3)]


def test_weighted_composition() -> None:
    settings = RewardSettings(em_weight=0.5, f1_weight=0.2, format_weight=0.2, process_weight=0.1)
    parts = RewardScorer(settings).score(ScoreInput(_trajectory("the Eiffel Tower") + " !", ["Eiffel Tower"]))
    assert (parts.exact_match, parts.f1, parts.format, parts.process) == (1.0, 1.0, 0.75, 0.0)
    assert parts.total == pytest.approx(0.5 + 0.2 + 0.2 * 0.75)


V03 = RewardSettings.search_r1_v03()


@pytest.mark.parametrize(
    ("response", "total"),
    [
        (_trajectory("Paris"), 1.0),  # right answer, valid format
        (_trajectory("Paris") + " done.", 0.8),  # right answer, invalid format
        (_trajectory("Lyon"), 0.2),  # wrong answer, valid format
        (_trajectory("Lyon") + " done.", 0.1),  # wrong answer, invalid format
        ("<think>no idea</think>", 0.0),  # no answer
    ],
)
def test_search_r1_v03_scheme(response: str, total: float) -> None:
    assert RewardScorer(V03).score(ScoreInput(response, ["Paris"])).total == pytest.approx(total)


@pytest.mark.parametrize(("answer", "total"), [("Paris", 0.8), ("Lyon", 0.1)])
def test_a_turn_answered_by_the_invalid_action_feedback_makes_the_format_invalid(answer: str, total: float) -> None:
    """Search-R1's is_valid_sequence reads the inserted "My previous action is invalid" text as content between
    tags and calls the response invalid: a right answer after it earns 0.8, a wrong one 0.1 under v0.3."""
    spans = [
        Span("<think> I know this. </think>", SpanKind.GENERATED),
        Span(INVALID_ACTION_FEEDBACK, SpanKind.FEEDBACK),
        Span(f"<answer> {answer} </answer>", SpanKind.GENERATED),
    ]
    parts = RewardScorer(V03).score(ScoreInput(spans=spans, golden_answers=["Paris"]))
    assert parts.extracted_answer == answer
    assert parts.total == pytest.approx(total)
    assert parts.format < 1.0 and "invalid_action" in parts.reasons
    # The same response without the wasted turn is valid.
    valid = RewardScorer(V03).score(ScoreInput(spans=[Span(spans[0].text + spans[2].text, SpanKind.GENERATED)],
                                               golden_answers=["Paris"]))
    assert valid.format == 1.0 and valid.total == pytest.approx({"Paris": 1.0, "Lyon": 0.2}[answer])


def test_search_r1_v03_retrieval_bonus() -> None:
    settings = RewardSettings(scheme="search_r1_v03", retrieval_score=0.1)
    response = "<think>a</think><search>q</search><information>Paris is big.</information>" + \
        "<think>b</think><answer>Lyon</answer>"
    assert RewardScorer(settings).score(ScoreInput(response, ["Paris"])).total == pytest.approx(0.3)


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="scheme must be one of"):
        Composition(scheme="magic")


# -- bad input: a defined score and a reason ---------------------------------------------------
@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (ScoreInput("", ["Paris"]), "empty_response"),
        (ScoreInput("  \n\t", ["Paris"]), "empty_response"),
        (ScoreInput(_trajectory("Paris"), []), "missing_gold"),
        (ScoreInput(_trajectory("Paris"), ["the", "  "]), "missing_gold"),
        (ScoreInput("x" * 2001, ["Paris"]), "response_too_long"),
        (ScoreInput(_trajectory(""), ["Paris"]), "empty_answer"),
        (ScoreInput(_trajectory("Lyon"), ["Paris"]), "wrong_answer"),
    ],
)
def test_bad_items_get_zero_and_a_reason(item: ScoreInput, reason: str) -> None:
    parts = RewardScorer(RewardSettings(max_response_chars=2000)).score(item)
    assert parts.exact_match == 0.0
    assert parts.total == 0.0
    assert reason in parts.reasons


def test_broken_unicode_is_scored() -> None:
    lone_surrogate = RewardScorer().score(ScoreInput(_trajectory("Par\ud800is"), ["Paris"]))
    assert "invalid_unicode" in lone_surrogate.reasons
    assert lone_surrogate.extracted_answer == "Par\ufffdis"
    split_pair = RewardScorer().score(ScoreInput(_trajectory("\ud83d\ude00"), ["\U0001f600"]))
    assert split_pair.exact_match == 1.0
    decoded_badly = RewardScorer().score(ScoreInput(_trajectory("Paris") + "\ufffd", ["Paris"]))
    assert decoded_badly.exact_match == 1.0
    assert "replacement_char" in decoded_badly.reasons


def test_missing_gold_keeps_the_total_at_zero_in_every_scheme() -> None:
    for settings in (V03, RewardSettings(em_weight=0, format_weight=1)):
        parts = RewardScorer(settings).score(ScoreInput(_trajectory("Paris"), []))
        assert parts.total == 0.0
        assert parts.format == 1.0


# Any code point, lone surrogates included, mixed with the tags.
_any_text = st.lists(
    st.one_of(st.text(st.characters(exclude_categories=()), max_size=8),
              st.sampled_from(["<think>", "</think>", "<search>", "</search>", "<information>",
                               "</information>", "<answer>", "</answer>", "<|im_start|>assistant",
                               "\ud800", "\udc00", "\ufffd"])),
    max_size=20,
).map("".join)


@given(_any_text, st.lists(_any_text, max_size=3), st.lists(_any_text, max_size=2))
def test_any_input_gets_a_defined_score(response: str, golds: list[str], titles: list[str]) -> None:
    settings = RewardSettings(em_weight=1, f1_weight=1, format_weight=1, process_weight=1)
    parts = RewardScorer(settings).score(ScoreInput(response, golds, titles))
    for value in (parts.exact_match, parts.f1, parts.format, parts.process):
        assert 0.0 <= value <= 1.0
    assert 0.0 <= parts.total <= 4.0
    parts.extracted_answer.encode("utf-8")  # raises on a lone surrogate, which protobuf could not send
    assert parts.reasons or parts.total == 4.0


def test_malformed_batches_are_refused() -> None:
    scorer = RewardScorer(RewardSettings(max_items=2, max_rounds=4))
    with pytest.raises(InvalidArgument, match="3 items in one request, the limit is 2"):
        scorer.score_batch([ScoreInput("a")] * 3)
    with pytest.raises(InvalidArgument, match=r"items\[1\].retrieved_rounds: round 4 is outside \[0, 4\)"):
        scorer.score_batch([ScoreInput("a"), ScoreInput("a", retrieved=[RetrievedPassage("t", "x", 4)])])


def test_batch_keeps_order() -> None:
    items = [ScoreInput(_trajectory(a), ["Paris"], id=a) for a in ("Paris", "Lyon", "paris.")]
    assert [p.exact_match for p in RewardScorer().score_batch(items)] == [1.0, 0.0, 1.0]
