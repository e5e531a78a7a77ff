"""The async rollout worker's scheduling against real Redis and a real reward server; the engine is the loop's
scripted one, slowed per question so that groups end in a known order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from ragr1.protocol.information import Passage
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.streams import PROMPTS, StreamQueue
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling
from ragr1.services.policy.backends import RewardServiceScorer
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import ASYNC, Policy, RolloutLimits
from ragr1.services.policy.streaming import EngineBatch, StreamingRolloutWorker
from ragr1.services.policy.weights import InFlight
from ragr1.v1 import common_pb2
from tests.common.waiting import wait_event_async, wait_for, wait_for_async
from tests.policy.scripted import ScriptedEngine, ScriptedSearch
from tests.policy.test_worker import PausedEngine, queues, worker_settings

SCRIPT = {
    "Slow one?": ["<search> slow </search>", "<answer> slowly </answer>"],
    "Fast one?": ["<answer> fast </answer>"],
    "Fast two?": ["<answer> fast </answer>"],
    "Fast three?": ["<answer> fast </answer>"],
}
SECONDS = {"Slow one?": 0.6, "Fast one?": 0.05, "Fast two?": 0.05, "Fast three?": 0.05}


class TimedEngine(ScriptedEngine):
    """Each generation takes its question's time; records the requests in the engine at once, at their peak."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, SCRIPT)
        self.running = 0
        self.peak = 0
        self.ended: list[str] = []

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        (request,) = requests  # the async loop sends each trajectory's turn alone
        question = next(q for q in SCRIPT if q in self.tokenizer.decode(request.prompt_ids))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(SECONDS[question])
            return await super().generate(requests, sampling, stop)
        finally:
            self.running -= 1


def async_policy(engine: ScriptedEngine, tokenizer: Any, model_dir: Path) -> Policy:
    return Policy(engine, tokenizer, ScriptedSearch(), LoopConfig(), model_dir=model_dir, default_sampling=Sampling(),
                  limits=RolloutLimits(max_batch=8), schedule=RolloutLoopSettings(rollout_loop=ASYNC))


def streaming_worker(policy: Policy, reward_server: ServiceProcess, prompts: StreamQueue[Any],
                     rollouts: StreamQueue[Any], max_in_flight: int, grace_seconds: float = 0.0,
                     keep_full: bool = False) -> StreamingRolloutWorker:
    return StreamingRolloutWorker(policy, RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                                  worker_settings(reclaim_idle_ms=600_000, grace_seconds=grace_seconds),
                                  max_in_flight=EngineBatch(lambda tokens: max_in_flight, 1, 1) if keep_full
                                  else max_in_flight)


def produced_order(worker: StreamingRolloutWorker, rollouts: StreamQueue[Any], count: int) -> list[str]:
    """Runs the worker until ``count`` rollouts are produced, then stops it; their task ids in arrival order."""
    order: list[str] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))

        async def take() -> None:
            order.extend(d.message.task_id for d in await asyncio.to_thread(rollouts.consume, 10, 100))

        await wait_for_async(lambda: len(order) >= count, f"{count} rollouts were never produced", 50, step=take)
        stop.set()
        await asyncio.wait_for(running, 10)
        await worker.scorer.close()  # type: ignore[attr-defined]

    asyncio.run(asyncio.wait_for(scenario(), 60))
    return order


def task(task_id: str, question: str, samples: int = 1) -> common_pb2.PromptTask:
    return common_pb2.PromptTask(id=task_id, question=question, golden_answers=["fast"], num_samples=samples)


def test_a_new_group_starts_as_soon_as_one_ends_and_each_is_acknowledged_once_with_all_its_rollouts(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """Room for three trajectories: the slow group (two samples) and the first fast one start; each fast group
    that ends lets the next one in while the slow group still runs, so all the fast ones are done before it
    is. Every group's rollouts arrive with its acknowledgement, once."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?", 2), task("f1", "Fast one?"), task("f2", "Fast two?"),
                     task("f3", "Fast three?")])
    engine = TimedEngine(tokenizer)
    worker = streaming_worker(async_policy(engine, tokenizer, policy_model_dir), reward_server, prompts, rollouts, 3)
    order = produced_order(worker, rollouts, 5)
    assert order[-2:] == ["slow", "slow"], order
    assert sorted(order) == ["f1", "f2", "f3", "slow", "slow"]
    assert engine.peak == 3
    assert rollouts.consume(10) == []  # nothing produced twice
    assert prompts.pending() == 0 and all(prompts.is_done(t) for t in ("slow", "f1", "f2", "f3"))


@pytest.mark.parametrize("in_flight", [InFlight.FINISH, InFlight.ABORT])
def test_a_weight_update_among_running_groups_tags_each_rollout_with_the_weights_it_ran_on(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path,
    in_flight: InFlight,
) -> None:
    """The fence holds per trajectory: an update waits for the running ones (finish) or aborts them (abort),
    those that start meanwhile wait for it and carry the new version, and nothing mixes versions."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?"), task("f1", "Fast one?"), task("f2", "Fast two?")])
    engine = TimedEngine(tokenizer)
    policy = async_policy(engine, tokenizer, policy_model_dir)
    worker = streaming_worker(policy, reward_server, prompts, rollouts, 2)
    loads: list[int] = []
    # Abort: the running trajectories stop at their next turn; the slow one has one more, the fast one none
    # (the scripted engine does not cut a generation short, as vLLM's would).
    expected = {"slow": 0, "f1": 0, "f2": 1} if in_flight is InFlight.FINISH else {"f1": 0, "f2": 1}

    async def load() -> None:
        loads.append(policy.gate.running)

    async def scenario() -> list[common_pb2.Rollout]:
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        await wait_for_async(lambda: engine.running >= 2, "two trajectories never ran in the engine", 30)
        await policy.gate.update(1, "v1", load, in_flight=in_flight, abort=policy.engine.abort_all)
        produced: list[common_pb2.Rollout] = []

        async def take() -> None:
            produced.extend(d.message for d in await asyncio.to_thread(rollouts.consume, 10, 100))

        await wait_for_async(lambda: {m.task_id for m in produced} == set(expected),
                             f"the rollouts of {sorted(expected)} never all arrived", 30, step=take)
        stop.set()
        await asyncio.wait_for(running, 10)
        await worker.scorer.close()  # type: ignore[attr-defined]
        return produced

    aborted = REGISTRY.get_sample_value("ragr1_policy_worker_requeues_total", {"reason": "aborted"}) or 0
    produced = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert loads == [0]  # the weights changed with no trajectory running
    assert {m.task_id: m.policy_version for m in produced} == expected
    assert len(produced) == len(expected)
    if in_flight is InFlight.ABORT:  # aborted: not acknowledged, handed back at once with the delivery counted
        assert not prompts.is_done("slow")
        assert (REGISTRY.get_sample_value("ragr1_policy_worker_requeues_total", {"reason": "aborted"}) or 0) > aborted
        other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
        again: list[Any] = []
        wait_for(lambda: again, "the aborted prompt never came back", 10,
                 step=lambda: again.extend(other.reclaim(600_000, 10)))
        assert [(d.message.id, d.deliveries) for d in again] == [("slow", 2)]


def test_a_leaving_async_worker_hands_back_the_groups_it_aborted_and_the_one_it_had_not_started(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """Room for two: the first prompt runs (and never finishes), the second (two samples) waits for room. Asked
    to stop, the worker takes no more, aborts the running group after the grace period and hands both back
    with their delivery counts unchanged; the third prompt it never took stays for anyone."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("running", "Fast one?"), task("waiting", "Fast two?", 2), task("later", "Fast three?")])
    engine = PausedEngine(tokenizer)
    worker = streaming_worker(async_policy(engine, tokenizer, policy_model_dir), reward_server, prompts, rollouts, 2,
                              grace_seconds=0.4)

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        await wait_event_async(engine.started, "the engine never started a generation", 10)
        await wait_for_async(lambda: prompts.pending() >= 2, "the worker never took the second prompt", 30)
        stop.set()
        await asyncio.wait_for(running, 10)
        await worker.scorer.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())
    assert engine.aborts == 1
    assert rollouts.consume(10) == [] and not prompts.is_done("running") and not prompts.is_done("waiting")
    assert "w1" not in {c["name"].decode() for c in redis_client.xinfo_consumers(PROMPTS, "w")}
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    taken = other.reclaim(600_000, 10)
    assert sorted(d.message.id for d in taken) == ["running", "waiting"]
    assert [d.deliveries for d in taken] == [1, 1]
    assert [d.message.id for d in other.consume(10)] == ["later"]


def test_a_group_waits_for_room_for_all_its_samples_and_one_larger_than_the_room_runs_alone(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """Room for two: the slow prompt runs; the next group (two samples) does not start beside it, and the one of
    three samples (more than the room) starts once nothing else runs: never more than it in the engine."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?"), task("pair", "Fast one?", 2), task("three", "Fast two?", 3)])
    engine = TimedEngine(tokenizer)
    worker = streaming_worker(async_policy(engine, tokenizer, policy_model_dir), reward_server, prompts, rollouts, 2)
    order = produced_order(worker, rollouts, 6)
    assert order == ["slow", "pair", "pair", "three", "three", "three"]
    assert engine.peak == 3


def test_kept_full_a_group_starts_while_fewer_than_the_engines_batch_run(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """The default (max_in_flight 0): a batch of two kept full. Beside the slow prompt (one running) the pair starts
    at once, three running; the group of three waits until fewer than two run (the pair has ended), then starts
    beside the slow one: the engine never holds fewer than its batch while prompts wait."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?"), task("pair", "Fast one?", 2), task("three", "Fast two?", 3)])
    engine = TimedEngine(tokenizer)
    worker = streaming_worker(async_policy(engine, tokenizer, policy_model_dir), reward_server, prompts, rollouts, 2,
                              keep_full=True)
    order = produced_order(worker, rollouts, 6)
    assert order == ["pair", "pair", "three", "three", "three", "slow"]
    assert engine.peak == 4


class SlowSearch(ScriptedSearch):
    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        await asyncio.sleep(1.0)
        return await super().search(queries, groups)


def test_kept_full_a_trajectory_waiting_on_a_search_leaves_its_place_in_the_batch_to_another(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """A batch of one: while the slow prompt's trajectory waits a second on its search, the engine's one place is
    free, and the fast prompts run in it one after the other (never more than twice the batch running); each is
    done before the slow one."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?"), task("f1", "Fast one?"), task("f2", "Fast two?")])
    engine = TimedEngine(tokenizer)
    policy = Policy(engine, tokenizer, SlowSearch(), LoopConfig(), model_dir=policy_model_dir,
                    default_sampling=Sampling(), limits=RolloutLimits(max_batch=8),
                    schedule=RolloutLoopSettings(rollout_loop=ASYNC))
    worker = streaming_worker(policy, reward_server, prompts, rollouts, 1, keep_full=True)
    assert produced_order(worker, rollouts, 3) == ["f1", "f2", "slow"]
    assert engine.peak == 1


class UnevenEngine(TimedEngine):
    """The first sample of a question to arrive is fast, the others slow: a group whose members end apart."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.seen: dict[str, int] = {}

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        (request,) = requests
        question = next(q for q in SCRIPT if q in self.tokenizer.decode(request.prompt_ids))
        self.seen[question] = self.seen.get(question, 0) + 1
        await asyncio.sleep(0.05 if self.seen[question] == 1 else 0.6)
        return await ScriptedEngine.generate(self, requests, sampling, stop)


def test_a_sample_that_ended_frees_its_place_before_its_group_ends(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """Room for two, taken by a pair whose first sample ends long before the second: the next prompt starts in the
    place the first sample left and is done before the pair, whose rollouts wait for its slow member."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("pair", "Fast one?", 2), task("next", "Fast two?")])
    worker = streaming_worker(async_policy(UnevenEngine(tokenizer), tokenizer, policy_model_dir), reward_server,
                              prompts, rollouts, 2)
    assert produced_order(worker, rollouts, 3) == ["next", "pair", "pair"]
