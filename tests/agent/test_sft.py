"""SFT trajectories teach exactly the token ids the policy's loop later produces and shows the model."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ragr1.agent.information import InformationFormat, Passage
from ragr1.agent.prompts import Mode
from ragr1.agent.sft import SupportedQuestion, trajectory
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.services.trainer import data
from ragr1.shipped import train_path
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
    (expected,) = data.tokenize_trajectories(tokenizer, [data.Trajectory(item.question, mode, pieces)])

    script = {item.question: [text for text, generated in pieces if generated]}
    loop = AgentLoop(ScriptedEngine(tokenizer, script), GoldSearch(item), tokenizer, config)
    (t,) = asyncio.run(loop.run([Task("q", item.question, mode)], Sampling(max_tokens=256), version=0))

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
