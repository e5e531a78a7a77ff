"""The loop's retrieval path against the real retriever server (router + shard over a FAISS index).

The engine is the loop's scripted one: untrained SmolLM2 never writes a well-formed <search> (none
in 128 sampled first turns here), so this is how the real retriever meets the loop in a test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.agent import AgentLoop, LoopConfig, Sampling, Task, TrajectoryStatus
from ragr1.services.policy.backends import RetrieverSearch
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import Policy, RolloutLimits
from ragr1.services.policy.servicer import PolicyServicer
from ragr1.v1 import policy_pb2
from tests.policy.conftest import hotpot_rows
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
    from ragr1.services.common.redis_server import free_port

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


def test_the_policy_describes_what_its_results_depend_on(
    retriever_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path, tmp_path: Path
) -> None:
    """``Policy.Info``: the served checkpoint and its hash, the loop's settings, the sampling defaults and seed,
    and the real retriever's index (corpus hash and size, encoder, index type); a retriever that does not
    answer, or a checkpoint gone from disk, is reported as such and the rest still answers."""

    async def info(address: str, served: Path | None = None) -> policy_pb2.PolicyInfoResponse:
        search = RetrieverSearch(address, top_k=2, timeout=10)
        policy = Policy(cast(Any, ScriptedEngine(tokenizer, {})), tokenizer, search, LoopConfig(top_k=2, max_turns=3),
                        model_dir=policy_model_dir, default_sampling=Sampling(temperature=0.7), limits=RolloutLimits(),
                        engine_seed=5, schedule=RolloutLoopSettings())
        if served is not None:  # as if an update had loaded it
            policy.gate.version, policy.gate.checkpoint_path = 1, str(served)
        try:
            return await PolicyServicer(policy, None).Info(policy_pb2.PolicyInfoRequest(), None)
        finally:
            await search.close()

    reply = asyncio.run(info(retriever_server.target))
    assert (reply.weight_version, reply.checkpoint_path) == (0, str(policy_model_dir))
    assert reply.checkpoint_sha256 == checkpoint_sha256(policy_model_dir) and not reply.checkpoint_error
    assert (reply.top_k, reply.max_turns, reply.max_queries_per_search, reply.query_separator) == (2, 3, 3, ",")
    assert reply.default_sampling.temperature == pytest.approx(0.7) and reply.engine_seed == 5
    assert reply.retriever.index_type == "flat" and reply.retriever.num_passages > 0 and not reply.retriever_error
    assert len(reply.retriever.corpus_sha256) == 64 and len(reply.retriever.manifest_sha256) == 64
    assert reply.code_commit

    # A checkpoint of other weights hashes otherwise; one gone from disk is reported, as is a retriever that is down.
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"other weights")
    assert asyncio.run(info(retriever_server.target, other)).checkpoint_sha256 == checkpoint_sha256(other)
    assert checkpoint_sha256(other) != reply.checkpoint_sha256
    gone = asyncio.run(info(f"127.0.0.1:{free_port()}", tmp_path / "gone"))
    assert (gone.weight_version, gone.checkpoint_path, gone.checkpoint_sha256) == (1, str(tmp_path / "gone"), "")
    assert "no *.safetensors" in gone.checkpoint_error
    assert not gone.retriever.encoder and "UNAVAILABLE" in gone.retriever_error
    assert gone.top_k == 2
