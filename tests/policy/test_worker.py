"""The rollout worker against real Redis and a real reward server; the engine is the loop's scripted one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from ragr1.services.common import fleet
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, Backlog, StreamQueue
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling
from ragr1.services.policy.backends import RewardServiceScorer
from ragr1.services.policy.follower import FollowerSettings, WeightFollower
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import LOCKSTEP, Policy, RolloutLimits
from ragr1.services.policy.worker import RolloutWorker, WorkerSettings
from ragr1.v1 import common_pb2
from tests.common.waiting import holds_for_async, wait_event_async, wait_for, wait_for_async
from tests.policy.scripted import ScriptedEngine, ScriptedSearch

SCRIPT = {
    "Capital of France?": ["<think>Known.</think><answer> Paris </answer>"],
    "Who wrote Hamlet?": ["<search> Hamlet author </search>", "<answer> Shakespeare </answer>"],
}


# The lock-step worker's tests; tests/policy/test_streaming.py has the async worker's.
LOCKSTEP_LOOP = RolloutLoopSettings(rollout_loop=LOCKSTEP)
# A failed prompt's backoff in these tests: short, so that a test sees it handed out again within a second.
BACKOFF: dict[str, Any] = {"retry_backoff_seconds": 0.2, "retry_backoff_max_seconds": 1.0}


def worker_settings(**changes: Any) -> WorkerSettings:
    """A worker's settings in these tests: short polls and backoffs, and no grace period unless a test gives one."""
    return WorkerSettings(**{"worker_block_ms": 100, "reclaim_idle_ms": 60_000, "grace_seconds": 0.0, **BACKOFF,
                             **changes})


def make_policy(tokenizer: Any, model_dir: Path, search: ScriptedSearch) -> Policy:
    return Policy(
        ScriptedEngine(tokenizer, SCRIPT),
        tokenizer,
        search,
        LoopConfig(),
        model_dir=model_dir,
        default_sampling=Sampling(),
        limits=RolloutLimits(max_batch=8),
        schedule=LOCKSTEP_LOOP,
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
        worker_settings(on_retrieval_error="dead_letter" if dead_letter else "requeue"),
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
        # Handed back at once, its failed delivery counted: another worker takes it once its backoff has
        # passed, far from its own reclaim threshold (10 minutes).
        assert prompts.backlog() == Backlog(waiting=1, in_progress=0, holders=0)
        other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
        again: list[Any] = []
        wait_for(lambda: again, "never handed out again", 10, step=lambda: again.extend(other.reclaim(600_000, 10)))
        assert [(d.message.id, d.deliveries) for d in again] == [("ham", 2)]


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


def test_a_restarted_worker_hands_its_predecessors_prompts_back_and_takes_what_a_batch_holds(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """A replica re-created under the same (stable) consumer name finds what its predecessor was given and never
    acknowledged: it hands all of it back at once, no delivery counted, and takes what one batch holds (one
    prompt here), so the rest waits for any replica with room instead of being held, and renewed, by one that
    cannot start it; nothing waits for reclaim_idle_ms (60 s here)."""
    prompts, rollouts = queues(redis_client)
    prompts.produce(tasks())
    assert len(prompts.consume(10)) == 2  # delivered to "w1", which then died
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    worker = RolloutWorker(policy, RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                           worker_settings(worker_batch=1))
    assert run_step(worker) == 1
    (done,) = [d.message.task_id for d in rollouts.consume(10)]
    assert prompts.backlog() == Backlog(1, 0, 0)  # the other handed back, waiting, held by no one
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    (taken,) = other.reclaim(60_000, 10)
    assert {done, taken.message.id} == {"fr", "ham"} and taken.deliveries == 1


class PausedEngine(ScriptedEngine):
    """Generates nothing until aborted, as a vLLM engine in the middle of long generations; aborted, each
    request comes back with what it had (nothing) and finish_reason "abort", as vLLM's do."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, SCRIPT)
        self.started = asyncio.Event()
        self.aborted = asyncio.Event()

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        self.started.set()
        await self.aborted.wait()
        return [Generation([], [], None, "abort", None) for _ in requests]

    async def abort_all(self) -> None:
        self.aborts += 1
        self.aborted.set()


class StoppedEngine(PausedEngine):
    """An engine whose processes are stopped (SIGSTOP): its abort never answers either."""

    async def abort_all(self) -> None:
        self.aborts += 1
        await asyncio.Event().wait()


@pytest.mark.parametrize("engine_kind", [PausedEngine, StoppedEngine], ids=["aborts", "never-answers"])
def test_a_leaving_worker_hands_its_unfinished_prompts_back_for_another_to_take_at_once(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path,
    engine_kind: type[PausedEngine],
) -> None:
    """Asked to stop mid-rollout (SIGTERM: a scale-down), the worker takes no new prompt, gives its batch
    leave_seconds, aborts it, and hands both prompts back: another worker's reclaim takes them at its next
    look, though its idle threshold (reclaim_idle_ms, 10 minutes) is far from reached, with their delivery counts
    unchanged; the leaving consumer is gone from the group, and nothing was acknowledged or produced."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([*tasks(), common_pb2.PromptTask(id="later", question="Capital of France?")])
    engine = engine_kind(tokenizer)
    policy = Policy(engine, tokenizer, ScriptedSearch(), LoopConfig(), model_dir=policy_model_dir,
                    default_sampling=Sampling(), limits=RolloutLimits(max_batch=8), schedule=LOCKSTEP_LOOP)
    worker = RolloutWorker(policy, RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                           worker_settings(worker_batch=2, reclaim_idle_ms=600_000, grace_seconds=0.4))

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        await wait_event_async(engine.started, "the engine never started a generation", 10)
        stop.set()
        # It leaves even when the engine never answers its abort (it would wait on it for good).
        await asyncio.wait_for(running, 10)
        await worker.scorer.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())
    assert engine.aborts == 1  # the fault happened: the batch was cut off mid-generation
    assert rollouts.consume(10) == [] and not prompts.is_done("fr") and not prompts.is_done("ham")
    consumers = {c["name"].decode() for c in redis_client.xinfo_consumers(PROMPTS, "w")}
    assert "w1" not in consumers
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    taken = other.reclaim(600_000, 10)
    assert sorted(d.message.id for d in taken) == ["fr", "ham"]
    assert [d.deliveries for d in taken] == [1, 1]  # the hand-back counted as no failed delivery
    # The prompt the leaving worker never took is still there for anyone, once.
    assert [d.message.id for d in other.consume(10)] == ["later"]
    assert prompts.backlog().holders == 1 and prompts.pending() == 3


def test_the_worker_takes_no_prompt_until_its_replica_serves_the_announced_version(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """The follower and the worker as the server wires them: prompts queued before any version is announced
    (another run's, or a trainer that has not announced yet) wait; the trainer's starting weights announced as
    v0, here the replica's own model, the worker takes them and every rollout carries v0."""
    prompts, rollouts = queues(redis_client)
    prompts.produce(tasks())
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    serving: list[bool] = []
    answered = asyncio.Event()

    async def health(ready: bool) -> None:
        serving.append(ready)
        answered.set()

    follower = WeightFollower(policy, redis_client, "w1", FollowerSettings(heartbeat_seconds=0.1,
                              checkpoint_wait_seconds=1.0, refusal_retry_seconds=1.0), set_serving=health)
    worker = RolloutWorker(policy, RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                           worker_settings(), accepting=follower.accepting)

    async def scenario() -> list[Any]:
        stop = asyncio.Event()
        jobs = [asyncio.ensure_future(follower.run(stop)), asyncio.ensure_future(worker.run(stop))]
        await wait_event_async(answered, "the follower never set the replica's health", 10)
        # Ready for calls, but no prompt taken: the worker polls every block_ms (0.1 s), ten chances to take one.
        await holds_for_async(lambda: prompts.undelivered() == 2 and serving == [True],
                              "the worker took no prompt before any version was announced", 1.0)
        assert fleet.announce_checkpoint(redis_client, 0, policy_model_dir)
        produced: list[Any] = []

        async def take() -> None:
            produced.extend(await asyncio.to_thread(rollouts.consume, 10, 100))

        await wait_for_async(lambda: len(produced) >= 2, "the worker never produced both rollouts", 30, step=take)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*jobs), 10)
        await worker.scorer.close()  # type: ignore[attr-defined]
        return produced

    produced = asyncio.run(scenario())
    assert sorted(d.message.task_id for d in produced) == ["fr", "ham"]
    assert {d.message.policy_version for d in produced} == {0}
    assert prompts.pending() == 0
