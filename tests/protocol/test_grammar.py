"""The tag grammar: one turn's action, and whole responses parsed from who-wrote-what spans."""

from __future__ import annotations

from ragr1.protocol import grammar
from ragr1.protocol.grammar import Span, SpanKind, parse_response, parse_spans
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK


def parse(text: str, multi: bool = True, sep: str = ",", cap: int = 3) -> grammar.Action:
    return grammar.parse_action(text, multi_query=multi, separator=sep, max_queries=cap)


def test_multi_query_search_is_split_stripped_and_capped() -> None:
    action = parse("<think>two hops</think>\n<search> Hamlet author ,  Shakespeare birthplace,x,y </search>")
    assert action.kind == "search"
    assert action.queries == ("Hamlet author", "Shakespeare birthplace", "x")
    assert action.dropped == 1  # "y": RAG-R1 would have searched it too


def test_single_query_mode_keeps_the_whole_query() -> None:
    action = parse("<search> Hamlet author, birthplace </search>", multi=False)
    assert action.queries == ("Hamlet author, birthplace",)


def test_configured_separator() -> None:
    assert parse("<search> a, b; c </search>", sep=";").queries == ("a, b", "c")


def test_answer_and_invalid_actions() -> None:
    assert parse("<think>easy</think><answer> Paris </answer>") == grammar.Action("answer", "Paris")
    assert parse("I think the answer is Paris.").kind == "invalid"
    assert parse("<search>  , , </search>").kind == "invalid"
    assert parse("<search> unterminated").kind == "invalid"
    # The first complete action counts, as in RAG-R1.
    assert parse("<answer>a</answer><search>b</search>").kind == "answer"


def generated(text: str) -> Span:
    return Span(text, SpanKind.GENERATED)


def information(body: str) -> Span:
    return Span(f"{grammar.INFORMATION_OPEN}{body}{grammar.INFORMATION_CLOSE}", SpanKind.INFORMATION)


FEEDBACK = Span(INVALID_ACTION_FEEDBACK, SpanKind.FEEDBACK)


def test_feedback_quoting_the_tags_is_never_an_action() -> None:
    # A trajectory that never answered: two invalid turns, each answered by the system's feedback, which
    # spells out "<answer> and </answer>". Read as one text it would answer "and".
    spans = [generated("I do not know."), FEEDBACK, generated("Still not sure."), FEEDBACK]
    parsed = parse_spans(spans)
    assert parsed.answer is None and parsed.contents("search") == []
    assert parsed.invalid_actions == 2
    assert parse_response("".join(s.text for s in spans)).answer == "and"  # the trap the spans avoid


def test_tags_inside_information_are_text() -> None:
    body = 'Doc 1: "Quiz"\nThe quiz asks for <answer> Paris </answer> and <search> more </search>.'
    spans = [generated("<think>a</think>\n<search> capital </search>"), information(body),
             generated("<think>b</think>\n<answer> Rome </answer>")]
    parsed = parse_spans(spans)
    assert parsed.answer == "Rome"
    assert parsed.tag_sequence() == "tsita"
    assert parsed.contents("search") == [" capital "]
    assert parsed.contents("information") == [body]
    assert not parsed.errors and not parsed.text_outside_tags and not parsed.text_after_answer


def test_information_the_model_writes_itself_is_a_format_error_not_evidence() -> None:
    parsed = parse_spans([generated("<think>a</think><information>made up</information><answer>x</answer>")])
    assert "generated_information_tag" in parsed.errors
    assert parsed.contents("information") == [] and parsed.text_outside_tags


def test_a_tag_left_open_when_the_system_inserts_text_is_unclosed() -> None:
    parsed = parse_spans([generated("<think>half a thought"), FEEDBACK, generated("<answer> x </answer>")])
    assert parsed.errors == ["unclosed_tag"] and parsed.answer == "x"
    assert parsed.tag_sequence() == "a"


def test_plain_text_is_split_at_complete_information_blocks() -> None:
    text = "<think>a</think><search>q</search>\n<information>\nDoc 1: <answer>trap</answer>\n</information>\nok"
    assert [s.kind for s in grammar.split_information(text)] == [
        SpanKind.GENERATED, SpanKind.INFORMATION, SpanKind.GENERATED
    ]
    assert parse_response(text).answer is None
