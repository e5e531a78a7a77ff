"""SFT trajectories teach exactly the token ids the policy's loop later produces and shows the model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from ragr1.protocol.grammar import INFORMATION_CLOSE, INFORMATION_OPEN, parse_action
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import MAX_QUERIES, QUERY_SEPARATOR, Mode
from ragr1.protocol.trajectories import SupportedQuestion, trajectory
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.services.trainer import data
from ragr1.shipped import TRAIN_SETS, train_path
from tests.policy.scripted import ScriptedEngine


class GoldSearch:
    """Returns each supporting paragraph for the query that names its title, as the SFT data assumes."""

    def __init__(self, item: SupportedQuestion) -> None:
        self.pages = dict(item.gold)

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        return [[Passage("", q, self.pages[q])] for q in queries]


@pytest.mark.parametrize("mode", [Mode.SINGLE, Mode.MULTI, Mode.NONE])
def test_loop_replaying_an_sft_trajectory_produces_its_token_ids(tokenizer: Any, mode: Mode) -> None:
    (item,) = data.load_supported_questions(train_path("hotpotqa"), limit=1)
    item = SupportedQuestion(item.question, item.answer, item.gold, distractors=[])
    config = LoopConfig(top_k=1, tokens_per_query=60)
    pieces = trajectory(item, mode, InformationFormat(tokenizer, config.tokens_per_query), top_k=1)
    (expected,) = data.tokenize_trajectories(tokenizer, [data.SFTTrajectory(item.question, mode, pieces)])

    script = {item.question: [text for text, generated in pieces if generated]}
    loop = AgentLoop(ScriptedEngine(tokenizer, script), GoldSearch(item), tokenizer, config)
    (t,) = asyncio.run(loop.run([Task("q", item.question, mode)], Sampling(max_tokens_per_turn=256), version=0))

    assert t.status is TrajectoryStatus.ANSWERED
    assert t.prompt_ids == expected.prompt_ids
    # SFT also teaches the end-of-sequence token after the answer; the loop stops at </answer>.
    assert t.response_ids == expected.response_ids[:-1]
    assert t.loss_mask == expected.loss_mask[:-1]
    assert t.retrieval_rounds == {Mode.SINGLE: len(item.gold), Mode.MULTI: 1, Mode.NONE: 0}[mode]


def test_pieces_of_each_mode(tokenizer: Any) -> None:
    (item,) = data.load_supported_questions(train_path("hotpotqa"), limit=1)
    information = InformationFormat(tokenizer, 480)
    titles = [t for t, _ in item.gold]
    multi = trajectory(item, Mode.MULTI, information, top_k=3)
    assert [generated for _, generated in multi] == [True, False, True]
    assert multi[0][0].endswith(f"<search> {', '.join(titles)} </search>")
    assert all(f'"{title}"' in multi[1][0] for title in titles)  # the JSON layout quotes its titles
    single = trajectory(item, Mode.SINGLE, information, top_k=3)
    assert sum(1 for _, generated in single if not generated) == len(titles)
    none = trajectory(item, Mode.NONE, information, top_k=3)
    assert none == [(f"<think> I know the answer is {item.answer}. </think>\n<answer> {item.answer} </answer>", True)]


def _blocks(pieces: list[tuple[str, bool]]) -> list[tuple[str, str]]:
    """(the generated text that searched, the information block inserted after it), in order."""
    return [(pieces[i][0], pieces[i + 1][0]) for i in range(len(pieces) - 1) if pieces[i][1] and not pieces[i + 1][1]]


def _shown(block: str, mode: Mode) -> tuple[list[str] | None, list[str]]:
    """The queries a block names (multi-query's JSON; None in single-query mode, whose layout names none)
    and the documents it shows, one string per query."""
    assert block.startswith(INFORMATION_OPEN) and block.endswith(INFORMATION_CLOSE)
    body = block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)]
    if mode is Mode.SINGLE:
        return None, [body]
    layout = json.loads(body)
    return list(layout["query"]), list(layout["documents"])


@pytest.mark.parametrize("mode", [Mode.SINGLE, Mode.MULTI])
def test_the_parser_reads_every_sft_search_as_the_queries_its_information_shows(tokenizer: Any, mode: Mode) -> None:
    """Over every shipped training question: what RL's parser reads from each <search> of an SFT trajectory
    is what the following <information> block shows documents for, nothing dropped by the query cap, every
    supporting paragraph searched once. A comma inside a title must not become two queries at RL time."""
    information = InformationFormat(tokenizer, 0)  # no cut: the layout is under test, not the budget
    searches = misread = 0
    examples = []
    for name in TRAIN_SETS:
        for item in data.load_supported_questions(train_path(name)):
            pieces = trajectory(item, mode, information, top_k=1)
            shown_gold: list[str] = []
            for generated, block in _blocks(pieces):
                action = parse_action(generated, multi_query=mode is Mode.MULTI, separator=QUERY_SEPARATOR,
                                      max_queries=MAX_QUERIES)
                assert action.kind == "search", generated
                queries, documents = _shown(block, mode)
                searches += 1
                fragments = [q for q in action.content.split(QUERY_SEPARATOR) if q.strip()]
                expected = queries if queries is not None else [action.content]
                if list(action.queries) != expected or (mode is Mode.MULTI and len(fragments) > MAX_QUERIES):
                    misread += 1
                    examples.append((list(action.queries), expected))
                assert len(documents) == len(action.queries) or misread
                shown_gold += documents
            # Every supporting paragraph is shown once, as the first document of its query.
            wanted = [f'Doc 1: "{title}"\n{text}' for title, text in item.gold]
            assert sorted(shown_gold) == sorted(wanted) or misread, item.question
    assert misread == 0, f"{misread} of {searches} searches read differently, e.g. {examples[:3]}"
