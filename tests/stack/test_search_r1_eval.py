"""The Search-R1-compatible evaluation mode: its prompt word for word, its ``<information>`` layout, its
answer extraction and scores (EM, F1, cover-EM) per data source, and its parquet test files with the
seven benchmarks' data sources, as Search-R1's code (``make_prefix``, ``_passages2string``,
``qa_em.py``) and its data scripts have them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragr1.protocol.grammar import SpanKind
from ragr1.protocol.information import SEARCH_R1_OBS_TOKENS, InformationFormat, Passage
from ragr1.protocol.prompts import Mode, question_prompt
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.stack import evaluate, search_r1
from ragr1.v1 import common_pb2
from tests.policy.scripted import ScriptedEngine, ScriptedSearch

# Search-R1's make_prefix (scripts/data_process/qa_search_*_merge.py), typed out from its source.
THEIR_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
SEVEN = {"nq": "who wrote hamlet", "triviaqa": "Which planet is red?", "popqa": "Where was Ada Lovelace born?",
         "hotpotqa": "Who directed the film?", "2wikimultihopqa": "Which film came out first?",
         "musique": "Who is the spouse of the author?", "bamboogle": "Who was president when the car was built?"}


def test_the_prompt_is_search_r1s_word_for_word_with_its_question_clean_up() -> None:
    assert question_prompt("  who wrote hamlet ", Mode.SEARCH_R1) == THEIR_PROMPT.format(question="who wrote hamlet?")
    assert question_prompt("Who?", Mode.SEARCH_R1) == THEIR_PROMPT.format(question="Who?")


def test_the_information_block_is_laid_out_and_cut_as_search_r1_does(tokenizer: Any) -> None:
    passages = [[Passage("1", "Hamlet", "A play by Shakespeare."), Passage("2", "Globe", "A theatre.\nIn London.")]]
    block = InformationFormat(tokenizer, 480).search_r1_block(passages)
    assert block == ('\n\n<information>Doc 1(Title: "Hamlet") A play by Shakespeare.\n'
                     'Doc 2(Title: "Globe") A theatre.\nIn London.</information>\n\n')
    long = [[Passage(str(i), f"T{i}", "word " * 200) for i in range(3)]]
    cut = InformationFormat(tokenizer, 480).search_r1_block(long)
    assert len(tokenizer.encode(cut, add_special_tokens=False)) <= SEARCH_R1_OBS_TOKENS + 2
    assert cut.startswith("\n\n<information>Doc 1(Title:") and "</information>" not in cut


def test_the_loop_in_search_r1_mode_sends_one_query_and_inserts_their_block(tokenizer: Any) -> None:
    script = {"who wrote hamlet?": ["<think>x</think><search> hamlet author, extra </search>",
                                    "<answer> Shakespeare </answer>"]}
    engine, search = ScriptedEngine(tokenizer, script), ScriptedSearch()
    loop = AgentLoop(engine, search, tokenizer, LoopConfig())
    task = Task("t", "who wrote hamlet", Mode.SEARCH_R1)
    assert THEIR_PROMPT.format(question="who wrote hamlet?") in tokenizer.decode(loop.prompt_ids(task))
    [t] = asyncio.run(loop.run([task], Sampling(max_tokens_per_turn=64), version=1))
    assert t.status is TrajectoryStatus.ANSWERED and search.calls == [(["hamlet author, extra"], [0])]
    [info] = [s.text for s in t.spans if s.kind is SpanKind.INFORMATION]
    assert info.startswith('\n\n<information>Doc 1(Title: "Page hamlet author, extra 0") Facts about')


@pytest.mark.parametrize(("response", "answer"), [
    # The prompt holds two matches ("<answer> and </answer>", the Beijing example): no answer reads as Beijing.
    ("<think>no idea</think>", "Beijing"),
    ("<answer> Paris </answer>", "Paris"),
    ("<answer> Lyon </answer> then <answer>Paris</answer>", "Paris"),
    # The feedback after an invalid action quotes the tags: Search-R1 reads " and " as an answer.
    ("<search>\nMy previous action is invalid. If I want to give the final answer, I should put the answer "
     "between <answer> and </answer>. Let me try again.\n", "and"),
])
def test_the_answer_is_the_last_of_prompt_and_response_when_there_are_two(response: str, answer: str) -> None:
    prompt = question_prompt("Capital of France?", Mode.SEARCH_R1)
    assert search_r1.extract_answer(prompt, response) == answer
    assert search_r1.extract_answer("", "<answer> one </answer>") is None


def test_em_f1_and_cover_em_as_qa_em_scores_them() -> None:
    assert search_r1.score("q", "<answer> The Eiffel Tower! </answer>", ["eiffel tower"])[1:] == (1.0, 1.0, 1.0)
    _, em, f1, cover = search_r1.score("q", "<answer> it is the Eiffel Tower in Paris </answer>", ["Eiffel Tower"])
    assert (em, cover) == (0.0, 1.0) and 0 < f1 < 1
    assert search_r1.score("q", "no answer", ["x"]) == ("Beijing", 0.0, 0.0, 0.0)
    assert search_r1.score("capital of china", "no answer", ["Beijing"])[1] == 1.0  # as Search-R1 scores it


def rollout(source: str, question: str, response: str, golds: list[str]) -> common_pb2.Rollout:
    return common_pb2.Rollout(data_source=source, question=question, response_text=response, golden_answers=golds,
                              mode=common_pb2.SEARCH_MODE_SEARCH_R1)


def test_a_search_r1_test_parquet_with_the_seven_sources_is_read_and_scored_per_source(tmp_path: Path) -> None:
    rows = []
    for source, question in SEVEN.items():
        for k in range(2):
            rows.append({
                "data_source": source,
                "prompt": [{"role": "user", "content": THEIR_PROMPT.format(question=f"{question} {k}")}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": [f"gold {source}", "alias"]}},
                "extra_info": {"split": "test", "index": k},
            })
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    questions = evaluate.load_questions(path)
    assert [q.data_source for q in questions] == [s for s in SEVEN for _ in range(2)]
    assert questions[0].question == "who wrote hamlet 0" and questions[0].golden_answers == ["gold nq", "alias"]
    # The first question of every source is answered right, the second with the gold inside a sentence.
    answers = [f"gold {q.data_source}" if i % 2 == 0 else "it is alias" for i, q in enumerate(questions)]
    rollouts = [rollout(q.data_source, q.question, f"<answer> {a} </answer>", q.golden_answers)
                for q, a in zip(questions, answers, strict=True)]
    summaries = evaluate.summarise_sources("search-r1", rollouts, wall_seconds=14.0)
    assert [s.benchmark for s in summaries] == list(SEVEN)
    assert all((s.questions, s.exact_match, s.cover_em) == (2, 0.5, 1.0) for s in summaries)
    record = evaluate.rollout_record(rollouts[1])
    assert (record["mode"], record["answer"], record["exact_match"], record["cover_em"]) == (
        "search-r1", "it is alias", 0.0, 1.0)
    missing = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in rows[0].items() if k != "reward_model"}]), missing)
    with pytest.raises(ValueError, match=r"bad.parquet: row 0: missing field 'reward_model.ground_truth'"):
        evaluate.load_questions(missing)


def test_the_shipped_files_sources_take_search_r1s_names() -> None:
    assert [search_r1.source_name(s) for s in ("tq", "2wiki", "Bamboogle", "nq", "mine")] == [
        "triviaqa", "2wikimultihopqa", "bamboogle", "nq", "mine"]
    shipped = {q.data_source for name in ("tq", "2wiki", "bamboogle") for q in evaluate.load_questions(name, 1)}
    assert {search_r1.source_name(s) for s in shipped} == {"triviaqa", "2wikimultihopqa", "bamboogle"}


def test_other_modes_keep_the_rewards_scores_and_add_cover_em() -> None:
    r = common_pb2.Rollout(data_source="nq", golden_answers=["Paris"], mode=common_pb2.SEARCH_MODE_MULTI,
                           reward=common_pb2.RewardParts(exact_match=0.0, f1=0.5, extracted_answer="in Paris"))
    [s] = evaluate.summarise_sources("multi", [r], 1.0)
    assert (s.benchmark, s.exact_match, s.f1, s.cover_em) == ("nq", 0.0, 0.5, 1.0)
    # Beside the search-r1 mode in one run, the no-retrieval rows name the shipped sources as it does.
    tq = common_pb2.Rollout(data_source="tq", golden_answers=["x"], mode=common_pb2.SEARCH_MODE_NONE)
    assert [s.benchmark for s in evaluate.summarise_sources("none", [tq], 1.0)] == ["tq"]
    assert [s.benchmark for s in evaluate.summarise_sources("none", [tq], 1.0, search_r1_names=True)] == ["triviaqa"]
    # A benchmark of one source is reported under the name asked for, however its file spells the source.
    bamboogle = common_pb2.Rollout(data_source="Bamboogle", golden_answers=["x"], mode=common_pb2.SEARCH_MODE_MULTI)
    assert [s.benchmark for s in evaluate.summarise_sources("multi", [bamboogle], 1.0, benchmark="bamboogle")] == [
        "bamboogle"]
    mixed = [tq, bamboogle]
    assert [s.benchmark for s in evaluate.summarise_sources("multi", mixed, 1.0, benchmark="test")] == [
        "tq", "Bamboogle"]
    assert evaluate.parse_modes("all") == ["none", "single", "multi"]
    assert evaluate.parse_modes("search-r1,none") == ["search-r1", "none"]
