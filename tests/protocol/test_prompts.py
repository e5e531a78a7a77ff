"""The instructions of each search mode: RAG-R1's and Search-R1's words, and the no-retrieval variant."""

from __future__ import annotations

import pytest

from ragr1.protocol.prompts import Mode, question_from_prompt, question_prompt


def test_multi_query_prompt_is_rag_r1s() -> None:
    text = question_prompt("Who wrote Hamlet?", Mode.MULTI)
    assert "<search> query_1,query_2 </search>" in text
    assert "using up to three queries each time" in text
    assert "top searched results for each query between <information> and </information>" in text
    assert text.endswith("Question: Who wrote Hamlet?\n")


def test_single_query_prompt_is_search_r1s() -> None:
    text = question_prompt("Who wrote Hamlet?", Mode.SINGLE)
    assert "<search> query </search>" in text
    assert "queries each time" not in text


def test_no_retrieval_prompt_asks_for_an_answer_and_offers_no_search() -> None:
    text = question_prompt("Who wrote Hamlet?", Mode.NONE)
    assert "<search>" not in text and "<information>" not in text
    assert "<answer> and </answer>" in text and text.endswith("Question: Who wrote Hamlet?\n")


def test_separator_and_cap_shape_the_prompt() -> None:
    text = question_prompt("q", Mode.MULTI, separator=" | ", max_queries=2)
    assert "<search> query_1 | query_2 </search>" in text
    assert "using up to two queries each time" in text


def test_question_comes_back_out_of_any_prompt() -> None:
    for mode in Mode:
        assert question_from_prompt(question_prompt("  Who wrote Hamlet?  ", mode)) == "Who wrote Hamlet?"


def test_unknown_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown search mode 'both'; use one of single, multi, none"):
        Mode.parse("both")
