"""SFT trajectories searched through the real retriever (the session's, tests/common/servers.py) are what the
policy's loop produces and shows the model when it writes the same text: the loop, replaying a trajectory's
generated pieces against the same retriever, makes the same token ids, loss mask and rounds. And what SFT
trained on is recorded by source, question type and mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ragr1.protocol.information import InformationFormat
from ragr1.protocol.prompts import Mode
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.services.policy.backends import RetrieverSearch
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.trainer import data, sft_search
from ragr1.services.trainer.config import SFTConfig
from ragr1.shipped import train_path
from tests.common.servers import HOTPOT_QUESTIONS
from tests.policy.scripted import ScriptedEngine

TOP_K = 2


def searched(retriever: ServiceProcess, tokenizer: Any, modes: tuple[str, ...]) -> sft_search.Searched:
    items = data.load_supported_questions(train_path("hotpotqa"), HOTPOT_QUESTIONS)
    with RetrieverClient(retriever.target) as client:
        return sft_search.search_trajectories(items, modes, InformationFormat(tokenizer, 80),
                                              sft_search.retriever_search(client, TOP_K))


async def replay(retriever: str, tokenizer: Any, config: LoopConfig, script: dict[str, list[str]],
                 task: Task) -> Any:
    """The loop writing the scripted texts, searching the retriever at ``retriever``."""
    search = RetrieverSearch(retriever, top_k=TOP_K, timeout=30.0)
    try:
        loop = AgentLoop(ScriptedEngine(tokenizer, script), search, tokenizer, config)
        (t,) = await loop.run([task], Sampling(max_tokens_per_turn=256), version=0)
        return t
    finally:
        await search.close()


def test_the_loop_replaying_a_searched_trajectory_makes_its_token_ids(
    retriever_server: ServiceProcess, tokenizer: Any
) -> None:
    result = searched(retriever_server, tokenizer, ("single", "multi"))
    assert {t.mode for t in result.trajectories} == {Mode.SINGLE, Mode.MULTI}
    assert any(t.rounds > 1 for t in result.trajectories)  # a bridge followed, not only first rounds
    config = LoopConfig(top_k=TOP_K, tokens_per_query=80)
    for trajectory in result.trajectories:
        (expected,) = data.tokenize_trajectories(tokenizer, [trajectory])
        script = {trajectory.question: [text for text, generated in trajectory.segments if generated]}

        t = asyncio.run(replay(retriever_server.target, tokenizer, config, script,
                                   Task("q", trajectory.question, trajectory.mode)))
        assert t.status is TrajectoryStatus.ANSWERED
        assert t.prompt_ids == expected.prompt_ids
        # SFT also teaches the end-of-sequence token after the answer; the loop stops at </answer>.
        assert (t.response_ids, t.loss_mask) == (expected.response_ids[:-1], expected.loss_mask[:-1]), (
            trajectory.question, trajectory.mode)
        assert t.retrieval_rounds == trajectory.rounds


def test_a_trajectory_is_kept_only_where_its_passages_show_an_answer(
    retriever_server: ServiceProcess, tokenizer: Any
) -> None:
    result = searched(retriever_server, tokenizer, ("multi",))
    kept = {t.question for t in result.trajectories}
    items = data.load_supported_questions(train_path("hotpotqa"), HOTPOT_QUESTIONS)
    assert sum(result.built.values()) == len(items) and sum(result.kept.values()) == len(kept)
    for item in items:
        inserted = [text for t in result.trajectories if t.question == item.question
                    for text, generated in t.segments if not generated]
        assert (item.question in kept) == bool(inserted), item.question
        if inserted:
            # The answer said is an alias that some inserted block shows.
            said = next(t for t in result.trajectories if t.question == item.question).segments[-1][0]
            alias = said.split("<answer> ")[1].split(" </answer>")[0]
            assert alias in item.answers and any(alias.lower() in block.lower() for block in inserted)


def test_sft_records_what_it_trains_on_and_names_a_retriever_that_does_not_answer(
    retriever_server: ServiceProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from ragr1.services.trainer.model import PolicyModel
    from ragr1.services.trainer.sft import SFTTrainer

    config = SFTConfig(model=str(tiny_model_dir), output_dir=str(tmp_path), limit=HOTPOT_QUESTIONS, top_k=TOP_K,
                       tokens_per_query=40, bf16=False, retriever_address=retriever_server.target)
    trainer = SFTTrainer(config, PolicyModel(tiny_model_dir, bf16=False))
    trajectories = trainer.build_trajectories()
    record = json.loads((tmp_path / "sft_data.json").read_text())
    assert sum(row["trajectories"] for row in record["trained"]) == len(trajectories) > 0
    for row in record["trained"]:
        mine = [t for t in trajectories if (t.source, t.question_type, t.mode.value)
                == (row["source"], row["question_type"], row["mode"])]
        assert row["trajectories"] == len(mine)
        assert row["rounds"] == pytest.approx(sum(t.rounds for t in mine) / len(mine))
        assert row["source"] == "hotpotqa" and row["question_type"] in ("bridge", "comparison")
    assert sum(row["built"] for row in record["searched"]) == HOTPOT_QUESTIONS * len(config.modes)
    assert data.load_trajectories(tmp_path / "sft_trajectories.jsonl") == trajectories

    down = SFTConfig(model=str(tiny_model_dir), output_dir=str(tmp_path / "down"), limit=1,
                     retriever_address=f"127.0.0.1:{free_port()}", bf16=False)
    with pytest.raises(ValueError, match=rf"search the retriever at {down.retriever_address}"):
        SFTTrainer(down, trainer.model).build_trajectories()

