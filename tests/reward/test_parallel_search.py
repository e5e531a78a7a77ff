"""ParallelSearch's reward (the ``parallel_search`` scheme) by hand on real questions, in the loop's own format:
responses built from the protocol's pieces, sent as the rollout workers send them (generated spans, inserted
information blocks), each expected total written from the scheme's constants."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ragr1.protocol.grammar import Span, SpanKind, split_queries
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import QUERY_SEPARATOR
from ragr1.protocol.trajectories import answer, search_call, search_query, think
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.agent import Task, Trajectory
from ragr1.services.policy.rollouts import score_item
from ragr1.services.reward.client import RewardClient
from ragr1.services.reward.parallel_search import ParallelSearchSettings
from ragr1.services.reward.scoring import RewardScorer, RewardSettings, ScoreInput
from ragr1.shipped import BRIDGE, COMPARISON, SINGLE_HOP, question_type, read_jsonl, train_path
from ragr1.v1 import common_pb2, reward_pb2

PS = ParallelSearchSettings()
C, S, F = PS.comp_score, PS.count_score, PS.format_score
RIGHT = 1.0  # what a right answer in a valid format earns, in every scheme of Search-R1's family
SCORER = RewardScorer(RewardSettings(scheme="parallel_search"))
# The demo's per-query budget: blocks cut as the loop cuts them.
TOKENS_PER_QUERY = 160


def _record(source: str, kind: str) -> dict[str, Any]:
    """The first question of a shipped training set of that type whose answer is a name, not yes or no."""
    for record in read_jsonl(train_path(source)):
        if question_type(record, source) == kind and record["golden_answers"][0].lower() not in ("yes", "no"):
            return record
    raise AssertionError(f"no {kind} question in {source}")


COMPARISON_Q = _record("hotpotqa", COMPARISON)
BRIDGE_Q = _record("hotpotqa", BRIDGE)
SINGLE_Q = _record("popqa", SINGLE_HOP)


@pytest.fixture(scope="module")
def blocks(tokenizer: Any) -> InformationFormat:
    return InformationFormat(tokenizer, TOKENS_PER_QUERY)


def _results(record: dict[str, Any], query: str) -> list[Passage]:
    """What a search for ``query`` shows: the page of that name first, then a page the question does not need."""
    pages = record["paragraphs"]
    named = [p for p in pages if search_query(p["title"]) == query]
    other = [p for p in pages if not p["is_supporting"]][:1] or pages[-1:]
    return [Passage(p["pid"], p["title"], p["text"]) for p in named + other]


def response(blocks: InformationFormat, record: dict[str, Any], rounds: Sequence[Sequence[str]],
             final: str | None, *, stray: str = "") -> list[Span]:
    """A multi-query trajectory: each round's think and search (generated), its information block (inserted),
    then a think and ``final`` as the answer (None: the model stops without one). ``stray``: text the model
    writes outside the tags before its answer (an invalid format)."""
    spans: list[Span] = []
    for queries in rounds:
        spans.append(Span(think(f"I need to know about {' and '.join(queries)}.") + search_call(queries),
                          SpanKind.GENERATED))
        spans.append(Span(blocks.block(queries, [_results(record, q) for q in queries], True), SpanKind.INFORMATION))
    ending = think("The documents answer it.") + stray
    spans.append(Span(ending + (answer(final) if final is not None else ""), SpanKind.GENERATED))
    return spans


def _titles(record: dict[str, Any]) -> list[str]:
    return [search_query(t) for t in record["supporting_titles"]]


def _score(spans: list[Span], record: dict[str, Any], kind: str) -> Any:
    return SCORER.score(ScoreInput(spans=spans, golden_answers=record["golden_answers"], question_type=kind))


def test_a_comparison_searched_in_one_round_of_two_queries(blocks: InformationFormat) -> None:
    gold = COMPARISON_Q["golden_answers"][0]
    parts = _score(response(blocks, COMPARISON_Q, [_titles(COMPARISON_Q)], gold), COMPARISON_Q, COMPARISON)
    assert (parts.exact_match, parts.format) == (1.0, 1.0)
    assert parts.decomposition == pytest.approx(3 * C) and parts.search_count == pytest.approx(S)
    assert parts.total == pytest.approx(RIGHT + 3 * C + S)


def test_a_comparison_searched_one_entity_a_round_gets_neither_part(blocks: InformationFormat) -> None:
    gold = COMPARISON_Q["golden_answers"][0]
    rounds = [[t] for t in _titles(COMPARISON_Q)]
    parts = _score(response(blocks, COMPARISON_Q, rounds, gold), COMPARISON_Q, COMPARISON)
    assert (parts.decomposition, parts.search_count) == (0.0, 0.0)
    assert parts.total == pytest.approx(RIGHT)


def test_a_bridge_searched_in_two_rounds_of_one_query(blocks: InformationFormat) -> None:
    rounds = [[t] for t in _titles(BRIDGE_Q)]
    parts = _score(response(blocks, BRIDGE_Q, rounds, BRIDGE_Q["golden_answers"][0]), BRIDGE_Q, BRIDGE)
    assert parts.decomposition == pytest.approx(C) and parts.search_count == pytest.approx(S)
    assert parts.total == pytest.approx(RIGHT + C + S)


def test_a_bridge_searched_at_once_gets_neither_part(blocks: InformationFormat) -> None:
    """Both pages of a bridge in one round: not the chain its question needs, and one search short of two."""
    parts = _score(response(blocks, BRIDGE_Q, [_titles(BRIDGE_Q)], BRIDGE_Q["golden_answers"][0]), BRIDGE_Q, BRIDGE)
    assert (parts.decomposition, parts.search_count) == (0.0, 0.0)
    assert parts.total == pytest.approx(RIGHT)


def test_a_single_hop_question_searched_once(blocks: InformationFormat) -> None:
    rounds = [[search_query(SINGLE_Q["supporting_titles"][0])]]
    parts = _score(response(blocks, SINGLE_Q, rounds, SINGLE_Q["golden_answers"][0]), SINGLE_Q, SINGLE_HOP)
    assert parts.total == pytest.approx(RIGHT + C + S)
    # An unknown type is their untyped ("na") class, the single-hop one.
    assert _score(response(blocks, SINGLE_Q, rounds, SINGLE_Q["golden_answers"][0]), SINGLE_Q, "").total == \
        pytest.approx(parts.total)


@pytest.mark.parametrize(
    ("final", "stray", "outcome", "reason"),
    [
        ("Sigmund Jähn", "", F, "wrong_answer"),  # wrong, valid: the format score
        (None, "", 0.0, "no_answer_tag"),  # no answer: never a valid format, nothing
        (None, "Let me answer now.", 0.0, "no_answer_tag"),
        ("Christer Fuglesang", "I am sure. ", RIGHT - F, "text_outside_tags"),  # right, invalid: less the format score
        ("Sigmund Jähn", "I am sure. ", PS.invalid_answer_score, "text_outside_tags"),  # wrong, invalid
    ],
)
def test_correctness_and_format(blocks: InformationFormat, final: str | None, stray: str, outcome: float,
                                reason: str) -> None:
    assert COMPARISON_Q["golden_answers"] == ["Christer Fuglesang"]  # the answers the cases name
    spans = response(blocks, COMPARISON_Q, [_titles(COMPARISON_Q)], final, stray=stray)
    parts = _score(spans, COMPARISON_Q, COMPARISON)
    assert reason in parts.reasons
    assert parts.total == pytest.approx(outcome + 3 * C + S)


def test_no_search_at_all(blocks: InformationFormat) -> None:
    """No search: not decomposed (c for a question that is no comparison), one search short of the best."""
    gold = SINGLE_Q["golden_answers"][0]
    assert _score(response(blocks, SINGLE_Q, [], gold), SINGLE_Q, SINGLE_HOP).total == pytest.approx(RIGHT + C)
    assert _score(response(blocks, COMPARISON_Q, [], "x"), COMPARISON_Q, COMPARISON).total == pytest.approx(F)
    assert _score(response(blocks, BRIDGE_Q, [], "x"), BRIDGE_Q, BRIDGE).total == pytest.approx(F + C - S)


def test_only_the_first_search_counts_as_decomposed(blocks: InformationFormat) -> None:
    first, second = _titles(COMPARISON_Q)
    gold = COMPARISON_Q["golden_answers"][0]
    late = _score(response(blocks, COMPARISON_Q, [[first], [first, second]], gold), COMPARISON_Q, COMPARISON)
    assert late.decomposition == 0.0 and late.search_count == 0.0


@pytest.mark.parametrize("searches", range(6))
@pytest.mark.parametrize(("kind", "is_comp"), [(COMPARISON, 1), (BRIDGE, 0), (SINGLE_HOP, -1)])
def test_the_search_count_is_theirs_less_the_prompts_two_mentions(
    blocks: InformationFormat, kind: str, is_comp: int, searches: int
) -> None:
    """Their count is every "<search>" of prompt and response, the instructions' two included (best 3, or 4+);
    here the model's own searches, so their rule shifted by two. Unclipped: each search past the best costs s."""
    theirs = searches + 2
    expected = S - abs(theirs - 3) * S if is_comp != 0 else S - abs(min(theirs, 4) - 4) * S
    record = {COMPARISON: COMPARISON_Q, BRIDGE: BRIDGE_Q, SINGLE_HOP: SINGLE_Q}[kind]
    rounds = [[_titles(record)[0]]] * searches
    parts = _score(response(blocks, record, rounds, record["golden_answers"][0]), record, kind)
    assert parts.search_count == pytest.approx(expected)


def test_a_search_is_decomposed_by_the_loops_own_split() -> None:
    """The reward reads a search's queries as the loop searched them: a trailing separator adds no query."""
    assert split_queries(" Sigmund Jähn, ", QUERY_SEPARATOR) == ("Sigmund Jähn",)
    one = think("t") + "<search> Sigmund Jähn, </search>"
    two = think("t") + search_call(["Sigmund Jähn", "Christer Fuglesang"])
    scored = [SCORER.score(ScoreInput(text + "<information>x</information>" + think("t") + answer("x"), ["x"],
                                      question_type=COMPARISON)) for text in (one, two)]
    assert [p.decomposition for p in scored] == pytest.approx([0.0, 3 * C])


def test_the_default_reward_reports_the_parts_but_pays_exact_match(blocks: InformationFormat) -> None:
    spans = response(blocks, COMPARISON_Q, [_titles(COMPARISON_Q)], "Sigmund Jähn")
    parts = RewardScorer().score(ScoreInput(spans=spans, golden_answers=COMPARISON_Q["golden_answers"],
                                            question_type=COMPARISON))
    assert parts.decomposition == pytest.approx(3 * C) and parts.search_count == pytest.approx(S)
    assert parts.total == 0.0


def test_an_unknown_question_type_is_named_and_scored_as_untyped(blocks: InformationFormat) -> None:
    spans = response(blocks, COMPARISON_Q, [_titles(COMPARISON_Q)], COMPARISON_Q["golden_answers"][0])
    odd = _score(spans, COMPARISON_Q, "temporal")
    assert "unknown_question_type" in odd.reasons
    untyped = _score(spans, COMPARISON_Q, "")
    assert "unknown_question_type" not in untyped.reasons
    assert odd.total == pytest.approx(untyped.total)
    assert odd.total == pytest.approx(RIGHT + S)


def test_the_constants_are_the_papers_and_settings_of_their_own() -> None:
    assert (PS.comp_score, PS.count_score, PS.format_score, PS.invalid_answer_score) == (0.15, 0.35, 0.1, 0.0)
    changed = RewardScorer(RewardSettings(scheme="parallel_search", parallel_search=ParallelSearchSettings(
        comp_score=0.5, count_score=0.0)))
    item = ScoreInput(search_call(["a", "b"]) + "<information>x</information>" + think("t") + answer("y"), ["y"],
                      question_type=COMPARISON)
    assert changed.score(item).decomposition == pytest.approx(1.5) and changed.score(item).search_count == 0.0
    with pytest.raises(ValueError, match="parallel_search scores must be >= 0"):
        ParallelSearchSettings(count_score=-0.1)


def test_the_rollout_workers_send_the_tasks_question_type() -> None:
    task = common_pb2.PromptTask(id="t", question=COMPARISON_Q["question"], question_type=COMPARISON)
    item = score_item(common_pb2.Rollout(id="t/0"), task, Trajectory(Task("t", task.question), [], 0))
    assert item.question_type == COMPARISON


# -- through the real server ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ragr1 serve reward --scheme parallel_search`` in a child process."""
    port = free_port()
    log = Path(tmp_path_factory.mktemp("reward-ps")) / "server.log"
    args = ["serve", "reward", "--port", str(port), "--metrics-port", "0", "--scheme", "parallel_search"]
    with ServiceProcess.ragr1("reward", args, f"127.0.0.1:{port}", log, start_timeout=60):
        yield f"127.0.0.1:{port}"


def test_the_server_pays_by_the_items_question_type(server: str, blocks: InformationFormat) -> None:
    spans = [common_pb2.ResponseSpan(text=s.text, kind=s.kind.value)  # type: ignore[arg-type]
             for s in response(blocks, COMPARISON_Q, [_titles(COMPARISON_Q)], COMPARISON_Q["golden_answers"][0])]
    kinds = [COMPARISON, BRIDGE, SINGLE_HOP, ""]
    with RewardClient(server) as client:
        scored = client.score([reward_pb2.ScoreItem(id=k, spans=spans, golden_answers=COMPARISON_Q["golden_answers"],
                                                    question_type=k) for k in kinds])
    assert [s.exact_match for s in scored] == [1.0] * 4
    assert [s.decomposition for s in scored] == pytest.approx([3 * C, 0.0, 0.0, 0.0])
    assert [s.search_count for s in scored] == pytest.approx([S, 0.0, S, S])
    assert [s.total for s in scored] == pytest.approx([RIGHT + 3 * C + S, RIGHT, RIGHT + S, RIGHT + S])
