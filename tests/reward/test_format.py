"""The tag parser and the format reward on crafted trajectories, including the prompt-answer trap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragr1.protocol.grammar import Span, SpanKind, parse_response
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK
from ragr1.services.reward.format_check import FormatWeights, check_format
from ragr1.services.reward.scoring import RewardScorer, RewardSettings, ScoreInput

# Search-R1's instruction prompt carries an example answer; its scorer searched prompt + response.
PROMPT = (
    "<|im_start|>user\nAnswer the given question. You must conduct reasoning inside <think> and "
    "</think> first every time you get new information. ... For example, <answer> Beijing </answer>. "
    "Question: What is the capital of China?<|im_end|>\n<|im_start|>assistant\n"
)
INFO = (
    "<information>Doc 1(Title: Beijing) Beijing is the capital of the People's Republic of China."
    "</information>"
)
GOOD = (
    "<think>I need the capital of China.</think>\n<search> capital of China </search>\n"
    f"{INFO}\n<think>The passage says Beijing.</think>\n<answer> Beijing </answer>"
)

# (response, format score with equal weights, valid, reasons that must be present)
CASES = [
    (GOOD, 1.0, True, ()),
    ("<think>Easy.</think><answer>Beijing</answer>", 1.0, True, ()),
    # two search rounds
    (f"<think>a</think><search>q1</search>{INFO}<think>b</think><search>q2</search>{INFO}"
     "<think>c</think><answer>Beijing</answer>", 1.0, True, ()),
    # truncated: the answer never closes
    ("<think>I need the capital.</think><answer> Beij", 0.25, False,
     ("unclosed_tag", "no_answer_tag", "bad_tag_order")),
    # chatter after the answer
    (GOOD + " Hope this helps!", 0.75, False, ("text_after_answer",)),
    # a search without a think before it
    (f"<search>capital of China</search>{INFO}<think>ok</think><answer>Beijing</answer>", 0.75, False,
     ("bad_tag_order",)),
    # the model writes its own <information>
    ("<think>a</think><information>made up</information><answer>Beijing</answer>", 0.75, False,
     ("bad_tag_order",)),
    # text between tags
    ("Sure! <think>a</think><answer>Beijing</answer>", 0.75, False, ("text_outside_tags",)),
    # nested tags and a stray closing tag
    ("<think>a <answer>Beijing</answer></think>", 0.25, False,
     ("nested_tag", "stray_closing_tag", "bad_tag_order")),
    # plain text, no tags at all
    ("Beijing", 0.25, False, ("no_answer_tag", "bad_tag_order", "text_outside_tags")),
]


@pytest.mark.parametrize(("response", "score", "valid", "reasons"), CASES)
def test_format(response: str, score: float, valid: bool, reasons: tuple[str, ...]) -> None:
    result = check_format(parse_response(response))
    assert result.score == pytest.approx(score)
    assert result.valid is valid
    assert set(reasons) <= set(result.reasons)
    assert bool(result.reasons) is not valid


def test_weights_change_the_score() -> None:
    parsed = parse_response(GOOD + " trailing")
    assert check_format(parsed, FormatWeights(tags=0, order=0, answer=1, clean=0)).score == 1.0
    assert check_format(parsed, FormatWeights(tags=0, order=0, answer=0, clean=1)).score == 0.0
    with pytest.raises(ValueError, match="format weights"):
        FormatWeights(tags=0, order=0, answer=0, clean=0)


def test_the_last_answer_counts() -> None:
    parsed = parse_response("<think>a</think><answer>London</answer><think>no</think><answer>Paris</answer>")
    assert parsed.answer == "Paris"
    assert not check_format(parsed).valid  # two answers break the order


def test_tags_inside_information_are_text() -> None:
    response = (
        "<think>a</think><search>q</search><information>Doc 1 quotes <answer>Shanghai</answer> and "
        "</think> and <search>.</information><think>b</think><answer>Beijing</answer>"
    )
    parsed = parse_response(response)
    assert parsed.answer == "Beijing"
    assert [s.tag for s in parsed.segments] == ["think", "search", "information", "think", "answer"]
    assert check_format(parsed).valid


def test_prompt_answer_trap_response_without_answer_scores_zero() -> None:
    """Search-R1 would find "Beijing" in the prompt's example; the response has no answer."""
    response = f"<think>I need the capital of China.</think><search>capital of China</search>{INFO}"
    parts = RewardScorer().score(ScoreInput(response, ["Beijing"]))
    assert parts.exact_match == 0.0
    assert parts.extracted_answer == ""
    assert "no_answer_tag" in parts.reasons


def test_prompt_answer_trap_whole_chat_sent_by_mistake() -> None:
    """A caller sends prompt + response: only the model's turn is scored, and the reason says so."""
    response = PROMPT + "<think>I need the capital of China.</think><search>capital of China</search>" + INFO
    parts = RewardScorer().score(ScoreInput(response, ["Beijing"]))
    assert parts.exact_match == 0.0
    assert {"prompt_in_response", "no_answer_tag"} <= set(parts.reasons)
    right = RewardScorer().score(ScoreInput(PROMPT + GOOD, ["Beijing"]))
    assert right.exact_match == 1.0
    assert right.format == 1.0


def test_prompt_answer_trap_passage_quoting_an_answer() -> None:
    response = (
        "<think>a</think><search>q</search><information>Doc 1: the template says "
        "<answer> Beijing </answer></information>"
    )
    parts = RewardScorer().score(ScoreInput(response, ["Beijing"]))
    assert parts.exact_match == 0.0
    assert "no_answer_tag" in parts.reasons


_fragments = st.sampled_from(
    ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "</information>",
     "Paris", " ", "x\n", "<", ">", "/"]
)


@given(st.lists(_fragments, max_size=30).map("".join))
def test_any_text_parses_and_scores_in_range(prefix: str) -> None:
    parsed = parse_response(prefix)
    result = check_format(parsed)
    assert 0.0 <= result.score <= 1.0
    # Whatever came before, a closed answer at the end is the answer (unless a tag is still open).
    tail = parse_response(prefix + "</think></search><answer> Lyon </answer>")
    assert tail.answer == "Lyon"


def _never_answered() -> list[Span]:
    return [
        Span("<think>I need the capital.</think> I will guess.", SpanKind.GENERATED),
        Span(INVALID_ACTION_FEEDBACK, SpanKind.FEEDBACK),
        Span("<think>Still unsure.</think>", SpanKind.GENERATED),
        Span(INVALID_ACTION_FEEDBACK, SpanKind.FEEDBACK),
    ]


@pytest.mark.parametrize("scheme", ["weighted", "search_r1_v03"])
def test_feedback_text_is_never_scored_as_an_answer(scheme: str) -> None:
    """The feedback quotes "<answer> and </answer>": a trajectory that never answered must not be scored
    as answering "and" (which passed the format's answer check and earned 0.1 under Search-R1's v0.3)."""
    scorer = RewardScorer(RewardSettings.search_r1_v03() if scheme == "search_r1_v03" else RewardSettings())
    parts = scorer.score(ScoreInput(spans=_never_answered(), golden_answers=["and"]))
    assert parts.extracted_answer == "" and parts.exact_match == 0.0 and parts.total == 0.0
    assert {"no_answer_tag", "invalid_action"} <= set(parts.reasons)
    # The same text sent as one string falls into the trap; that is why the policy sends spans.
    trapped = scorer.score(ScoreInput("".join(s.text for s in _never_answered()), ["and"]))
    assert trapped.extracted_answer == "and"


def test_spans_with_tags_inside_information_score_the_models_answer() -> None:
    spans = [
        Span("<think>a</think>\n<search> capital of China </search>", SpanKind.GENERATED),
        Span('\n<information>\nDoc 1: "Quiz"\nanswer: <answer> Shanghai </answer>\n</information>\n',
             SpanKind.INFORMATION),
        Span("<think>b</think>\n<answer> Beijing </answer>", SpanKind.GENERATED),
    ]
    parts = RewardScorer().score(ScoreInput(spans=spans, golden_answers=["Beijing"]))
    assert (parts.exact_match, parts.format, parts.extracted_answer) == (1.0, 1.0, "Beijing")
    # Process reward: the one round's passages come from the information span when none are attached.
    wrong = RewardScorer().score(ScoreInput(spans=spans, golden_answers=["Shanghai"]))
    assert wrong.exact_match == 0.0 and wrong.process == 1.0
