"""The loop's retrieval path against the real retriever server (router + shard over a FAISS index).

The engine is the loop's scripted one: untrained SmolLM2 never writes a well-formed <search> (none
in 128 sampled first turns here), so this is how the real retriever meets the loop in a test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.services.policy.backends import RetrieverSearch
from tests.common.servers import hotpot_rows
from tests.policy.scripted import ScriptedEngine


def gold_queries(row: dict[str, Any]) -> list[str]:
    return list(row["supporting_titles"][:2])


def test_one_real_search_call_per_turn_and_gold_passages_in_information(
    retriever_server: ServiceProcess, tokenizer: Any
) -> None:
    rows = hotpot_rows(2)
    script = {}
    for row in rows:
        script[row["question"]] = [
            f"<think>Two facts.</think><search> {', '.join(gold_queries(row))} </search>",
            "<answer> unknown </answer>",
        ]

    async def go() -> tuple[list[Any], int]:
        search = RetrieverSearch(retriever_server.target, top_k=3, timeout=30)
        loop = AgentLoop(ScriptedEngine(tokenizer, script), search, tokenizer, LoopConfig(top_k=3))
        try:
            out = await loop.run(
                [Task(f"t{i}", r["question"]) for i, r in enumerate(rows)], Sampling(), version=0
            )
        finally:
            await search.close()
        return out, search.calls

    trajectories, calls = asyncio.run(go())
    assert calls == 1
    for row, t in zip(rows, trajectories, strict=True):
        assert t.status is TrajectoryStatus.ANSWERED and (t.retrieval_rounds, t.num_queries) == (1, 2)
        titles = {p.title for _, p in t.retrieved}
        assert set(row["supporting_titles"]) <= titles
        # dedup_within_group: no passage twice among one trajectory's queries.
        ids = [p.id for _, p in t.retrieved]
        assert len(ids) == len(set(ids))
        inserted = tokenizer.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if not m])
        # RAG-R1's multi-query layout: the queries, then one document string per query, each
        # labelled with its titles, so the model can tell which query a passage answers.
        block = json.loads(inserted.split("<information>")[1].split("</information>")[0])
        assert block["query"] == gold_queries(row)
        for title, documents in zip(block["query"], block["documents"], strict=True):
            assert documents.startswith("Doc 1: ") and f'"{title}"' in documents


def test_a_dead_retriever_ends_trajectories_with_retrieval_error(tokenizer: Any) -> None:

    script = {"q": ["<search> anything </search>"]}

    async def go() -> Any:
        search = RetrieverSearch(f"127.0.0.1:{free_port()}", top_k=3, timeout=5)
        loop = AgentLoop(ScriptedEngine(tokenizer, script), search, tokenizer, LoopConfig())
        try:
            return (await loop.run([Task("t", "q")], Sampling(), version=0))[0]
        finally:
            await search.close()

    t = asyncio.run(go())
    assert t.status is TrajectoryStatus.RETRIEVAL_ERROR and "UNAVAILABLE" in t.error
