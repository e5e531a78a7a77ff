"""The rollout worker against real Redis and a real reward server; the engine is the loop's scripted one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from ragr1.services.common.errors import InvalidArgument
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.policy.agent import LoopConfig, Sampling, Task
from ragr1.services.policy.backends import RewardServiceScorer
from ragr1.services.policy.runtime import Policy, RolloutLimits
from ragr1.services.policy.worker import RolloutWorker
from ragr1.v1 import common_pb2
from tests.policy.scripted import ScriptedEngine, ScriptedSearch

SCRIPT = {
    "Capital of France?": ["<think>Known.</think><answer> Paris </answer>"],
    "Who wrote Hamlet?": ["<search> Hamlet author </search>", "<answer> Shakespeare </answer>"],
}


def make_policy(tokenizer: Any, model_dir: Path, search: ScriptedSearch) -> Policy:
    return Policy(
        ScriptedEngine(tokenizer, SCRIPT),
        tokenizer,
        search,
        LoopConfig(),
        model_dir=model_dir,
        default_sampling=Sampling(),
        limits=RolloutLimits(max_batch=8),
    )


def queues(client: redis.Redis) -> tuple[StreamQueue[Any], StreamQueue[Any]]:
    prompts = StreamQueue(client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w1")
    prompts.ensure_group()
    rollouts = StreamQueue(client, ROLLOUTS, common_pb2.Rollout, group="trainer")
    rollouts.ensure_group()
    return prompts, rollouts


def tasks() -> list[common_pb2.PromptTask]:
    return [
        common_pb2.PromptTask(id="fr", question="Capital of France?", golden_answers=["Paris"]),
        common_pb2.PromptTask(id="ham", question="Who wrote Hamlet?", golden_answers=["William Shakespeare"]),
    ]


def run_step(worker: RolloutWorker) -> int:
    async def go() -> int:
        try:
            return await worker.step()
        finally:
            await worker.scorer.close()  # type: ignore[attr-defined]

    return asyncio.run(go())


def worker_for(
    policy: Policy,
    reward_server: ServiceProcess,
    prompts: StreamQueue[Any],
    rollouts: StreamQueue[Any],
    *,
    dead_letter: bool,
) -> RolloutWorker:
    return RolloutWorker(
        policy,
        RewardServiceScorer(reward_server.target),
        prompts,
        rollouts,
        Sampling(),
        batch=8,
        block_ms=100,
        reclaim_idle_ms=60_000,
        dead_letter_retrieval_errors=dead_letter,
    )


def test_scored_rollouts_and_acks_in_one_step(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    prompts, rollouts = queues(redis_client)
    prompts.produce(tasks())
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    assert run_step(worker_for(policy, reward_server, prompts, rollouts, dead_letter=False)) == 2
    produced = {d.message.task_id: d.message for d in rollouts.consume(10)}
    assert set(produced) == {"fr", "ham"}
    assert produced["fr"].reward.exact_match == 1.0 and produced["fr"].reward.extracted_answer == "Paris"
    assert produced["ham"].reward.exact_match == 0.0 and produced["ham"].reward.f1 > 0
    assert produced["ham"].retrieval_rounds == 1
    assert prompts.pending() == 0 and prompts.is_done("fr") and prompts.is_done("ham")


@pytest.mark.parametrize("dead_letter", [False, True])
def test_retriever_failure_requeues_or_dead_letters(
    redis_client: redis.Redis,
    reward_server: ServiceProcess,
    tokenizer: Any,
    policy_model_dir: Path,
    dead_letter: bool,
) -> None:
    prompts, rollouts = queues(redis_client)
    prompts.produce(tasks())
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch(fail=ConnectionError("router down")))
    run_step(worker_for(policy, reward_server, prompts, rollouts, dead_letter=dead_letter))
    assert [d.message.task_id for d in rollouts.consume(10)] == ["fr"]
    assert prompts.is_done("fr") and not prompts.is_done("ham")
    if dead_letter:
        (dead,) = prompts.dead_letters()
        assert dead["id"] == "ham" and "router down" in dead["reason"]
        assert prompts.pending() == 0
    else:
        assert prompts.dead_letters() == []
        assert prompts.pending() == 1  # handed out again after reclaim_idle_ms
        (again,) = prompts.consume(10, pending=True)
        assert again.message.id == "ham" and again.deliveries == 2


def test_invalid_tasks_are_dead_lettered(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    prompts, rollouts = queues(redis_client)
    prompts.produce([common_pb2.PromptTask(id="blank", question="   "), tasks()[0]])
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    run_step(worker_for(policy, reward_server, prompts, rollouts, dead_letter=False))
    (dead,) = prompts.dead_letters()
    assert dead["id"] == "blank" and "question is empty" in dead["reason"]
    assert [d.message.task_id for d in rollouts.consume(10)] == ["fr"]


def test_policy_rejects_bad_requests(tokenizer: Any, policy_model_dir: Path) -> None:
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    many = [Task(str(i), f"question {i}") for i in range(9)]
    with pytest.raises(InvalidArgument, match="9 items; the limit is max_batch=8"):
        policy.prompt_ids(many)
    with pytest.raises(InvalidArgument, match=r"tasks\[0\].question is 5000 characters; the limit is 4096"):
        policy.prompt_ids([Task("long", "x" * 5000)])
    with pytest.raises(InvalidArgument, match="temperature"):
        policy.sampling(-1, 0, 0, 0, [])
    short = Policy(
        ScriptedEngine(tokenizer, SCRIPT),
        tokenizer,
        ScriptedSearch(),
        LoopConfig(max_model_len=100),
        model_dir=policy_model_dir,
        default_sampling=Sampling(),
        limits=RolloutLimits(),
    )
    with pytest.raises(InvalidArgument, match="tokens; the model's maximum length is 100"):
        short.prompt_ids([Task("q", "Who wrote Hamlet?")])


def test_samples_are_batched_within_max_batch(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    prompts, rollouts = queues(redis_client)
    fr = tasks()[0]
    prompts.produce(
        [
            common_pb2.PromptTask(id="a", question=fr.question, golden_answers=["Paris"], num_samples=5),
            common_pb2.PromptTask(id="b", question=fr.question, golden_answers=["Paris"], num_samples=5),
            common_pb2.PromptTask(id="huge", question=fr.question, num_samples=9),
        ]
    )
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    run_step(worker_for(policy, reward_server, prompts, rollouts, dead_letter=False))
    engine = policy.engine
    assert isinstance(engine, ScriptedEngine) and engine.batch_sizes == [5, 5]
    produced = [d.message for d in rollouts.consume(20)]
    assert sorted(m.task_id for m in produced) == ["a"] * 5 + ["b"] * 5
    assert all(m.group_id == m.task_id for m in produced)
    # Sample k of task t is "t/k": a prompt run twice (reclaimed from a slow worker) gives the same ids,
    # which the trainer de-duplicates.
    assert sorted(m.id for m in produced) == [f"{t}/{k}" for t in "ab" for k in range(5)]
    (dead,) = prompts.dead_letters()
    assert dead["id"] == "huge" and "9 samples" in dead["reason"]
    assert prompts.pending() == 0


def test_a_restarted_worker_resumes_its_own_pending_prompts_at_once(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """A replica re-created under the same (stable) consumer name takes back what its predecessor was
    given and never acknowledged, without waiting reclaim_idle_ms (60 s here)."""
    prompts, rollouts = queues(redis_client)
    prompts.produce(tasks())
    assert len(prompts.consume(10)) == 2  # delivered to "w1", which then died
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    assert run_step(worker_for(policy, reward_server, prompts, rollouts, dead_letter=False)) == 2
    assert sorted(d.message.task_id for d in rollouts.consume(10)) == ["fr", "ham"]
    assert prompts.pending() == 0
