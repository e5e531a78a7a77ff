"""The SFT trajectories' rules: a query is a name the question or a shown passage states, multi-query mode
searches a round's names at once and single-query mode one a round, a round follows only for what the last
revealed, and a trajectory whose passages show no answer alias is not kept. The passages here are the shipped
corpus's own pages (tests/common/corpus_search.py); the search through the real retriever is
tests/trainer/test_sft_search.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ragr1.protocol.grammar import INFORMATION_CLOSE, INFORMATION_OPEN, parse_action
from ragr1.protocol.information import InformationFormat
from ragr1.protocol.prompts import MAX_QUERIES, QUERY_SEPARATOR, Mode
from ragr1.protocol.trajectories import (
    Searcher,
    SupportedQuestion,
    contained_alias,
    named_in,
    names,
)
from ragr1.services.trainer import data
from ragr1.shipped import train_path
from tests.common import corpus_search


def question(source: str, text: str) -> SupportedQuestion:
    (item,) = [q for q in data.load_supported_questions(train_path(source)) if q.question == text]
    return item


COMPARISON = "Which person went into space at a later date, Sigmund Jähn or Christer Fuglesang?"
BRIDGE = "Hugo Rodríguez Romero is a Spanish footballer who plays for a team in the autonomous community of what?"
UNNAMED = "In what city was Belarmino Mario Chipongue born?"


def test_a_page_is_named_by_its_title_without_qualifier_or_what_follows_a_comma() -> None:
    assert names("The Deep Blue Sea (1955 film)") == ["The Deep Blue Sea"]
    assert names("Van Hook Township, Mountrail County, North Dakota") == [
        "Van Hook Township, Mountrail County, North Dakota", "Van Hook Township"]
    assert named_in("Van Hook Township, Mountrail County, North Dakota",
                    "What is the seat of the county where Van Hook Township is located?") == "Van Hook Township"
    # Whole words, punctuation aside: a possessive still names the page, a longer word does not.
    assert named_in("George Rankin", "What is George Rankin's occupation?") == "George Rankin"
    assert named_in("Rush", "the band Rushmore") is None
    assert contained_alias(["Spurs", "Tottenham"], ["known as Tottenham or Spurs."]) == "Spurs"
    assert contained_alias(["Spurs"], ["the Spursville club"]) is None


def run(item: SupportedQuestion, mode: Mode, tokenizer: Any, tokens_per_query: int = 0) -> Searcher:
    return corpus_search.run(item, mode, InformationFormat(tokenizer, tokens_per_query))


def test_a_comparison_searches_both_names_at_once_in_multi_mode_and_one_a_round_in_single(tokenizer: Any) -> None:
    item = question("hotpotqa", COMPARISON)
    multi, single = run(item, Mode.MULTI, tokenizer), run(item, Mode.SINGLE, tokenizer)
    # In the order the question names them; it names every page, so the question itself is not searched.
    assert multi.rounds == [["Sigmund Jähn", "Christer Fuglesang"]]
    assert single.rounds == [["Sigmund Jähn"], ["Christer Fuglesang"]]
    # Single-query mode's first think plans both rounds: the model is taught that a second search follows.
    thinks = {s.mode: [text.split("</think>")[0] for text, generated in s.pieces() or [] if generated]
              for s in (multi, single)}
    assert thinks[Mode.SINGLE] == [
        "<think> I need to know about Sigmund Jähn and Christer Fuglesang. I search for Sigmund Jähn first. ",
        "<think> I still need to know about Christer Fuglesang. ",
        "<think> The documents show the answer is Christer Fuglesang. "]
    assert thinks[Mode.MULTI][0] == "<think> I need to know about Sigmund Jähn and Christer Fuglesang. "
    for s in (multi, single):
        pieces = s.pieces()
        assert pieces is not None
        assert pieces[-1] == ("<think> The documents show the answer is Christer Fuglesang. </think>\n"
                              "<answer> Christer Fuglesang </answer>", True)


def test_a_bridge_entity_is_searched_only_after_a_passage_named_it(tokenizer: Any) -> None:
    item = question("hotpotqa", BRIDGE)
    for mode in (Mode.MULTI, Mode.SINGLE):
        s = run(item, mode, tokenizer)
        # FC Cartagena is named by Hugo's page, not by the question: a second round, in either mode; the
        # question itself is not searched beside the one name it states.
        assert s.rounds == [["Hugo Rodríguez Romero"], ["FC Cartagena"]]
        pieces = s.pieces()
        assert pieces is not None and "The documents mention FC Cartagena." in pieces[2][0]


def test_an_answer_on_a_page_that_does_not_answer_does_not_end_the_search(tokenizer: Any) -> None:
    """Hugo's search shows a politician's page that names Murcia, the answer, beside Hugo's own: the trajectory
    still reads FC Cartagena's page, the one that answers, rather than answer from a passage it cannot tell apart."""
    item = question("hotpotqa", BRIDGE)
    page = corpus_search.pages()
    other = page["Ramón Luis Valcárcel"]
    assert other.title not in item.gold and contained_alias(item.answers, [other.text]) == "Murcia"
    s = Searcher(item, Mode.SINGLE, InformationFormat(tokenizer, 0))
    s.read(s.queries(), [[page["Hugo Rodríguez Romero"], other]])
    assert s.queries() == ["FC Cartagena"]
    s.read(["FC Cartagena"], [[page["FC Cartagena"]]])
    assert s.queries() == [] and s.rounds == [["Hugo Rodríguez Romero"], ["FC Cartagena"]]
    pieces = s.pieces()
    assert pieces is not None and pieces[-1][0].endswith("<answer> Murcia </answer>")


def test_what_the_cut_leaves_out_is_not_shown_neither_names_nor_answers(tokenizer: Any) -> None:
    """Hugo's page names his club after its first words: with a block of a few tokens the club is never seen,
    so never searched, and with no answer in sight the trajectory is not kept."""
    s = run(question("hotpotqa", BRIDGE), Mode.SINGLE, tokenizer, tokens_per_query=8)
    assert s.rounds == [["Hugo Rodríguez Romero"]] and s.pieces() is None


def test_with_nothing_named_the_question_is_the_query_and_no_alias_shown_keeps_nothing(tokenizer: Any) -> None:
    item = question("popqa", UNNAMED)
    s = Searcher(item, Mode.MULTI, InformationFormat(tokenizer, 0))
    assert s.queries() == [UNNAMED]
    s.read([UNNAMED], [[corpus_search.pages()["Mário Belarmino"]]])
    # His page names the city, the answer: in sight, so no round for the city's own page.
    assert s.queries() == [] and s.rounds == [[UNNAMED]]
    pieces = s.pieces()
    assert pieces is not None and pieces[0][0].startswith("<think> I need to search for the question. </think>")
    assert pieces[-1][0].endswith("<answer> Lubango </answer>")
    unlucky = Searcher(item, Mode.MULTI, InformationFormat(tokenizer, 0))
    unlucky.read([UNNAMED], [[corpus_search.pages()["Sigmund Jähn"]]])
    assert unlucky.queries() == [] and unlucky.pieces() is None


def test_no_retrieval_answers_at_once_and_search_r1_has_no_sft(tokenizer: Any) -> None:
    item = question("hotpotqa", BRIDGE)
    s = Searcher(item, Mode.NONE, InformationFormat(tokenizer, 0))
    assert s.queries() == []
    assert s.pieces() == [("<think> I know the answer is Murcia. </think>\n<answer> Murcia </answer>", True)]
    with pytest.raises(ValueError, match="Search-R1 trains with RL alone"):
        Searcher(item, Mode.SEARCH_R1, InformationFormat(tokenizer, 0))


def _shown_queries(block: str) -> list[str]:
    assert block.startswith(INFORMATION_OPEN) and block.endswith(INFORMATION_CLOSE)
    return list(json.loads(block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)])["query"])


def test_the_parser_reads_every_multi_query_search_as_the_queries_its_block_shows(tokenizer: Any) -> None:
    """Over every HotpotQA and MuSiQue question: a comma inside a name ("Van Hook Township, Mountrail County")
    must not become two queries at RL time, and the cap of three is never passed."""
    commas = 0
    for source in ("hotpotqa", "musique"):
        for item in data.load_supported_questions(train_path(source)):
            s = run(item, Mode.MULTI, tokenizer)
            pieces = s.pieces() or []
            for (generated, _), (block, _) in zip(pieces[0::2], pieces[1::2], strict=False):
                action = parse_action(generated, multi_query=True, separator=QUERY_SEPARATOR,
                                      max_queries=MAX_QUERIES)
                assert list(action.queries) == _shown_queries(block), generated
                commas += any(QUERY_SEPARATOR in n for t in item.gold for n in names(t))
    assert commas > 0  # the case under test occurred
