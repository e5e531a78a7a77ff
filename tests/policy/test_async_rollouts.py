"""The async rollout loop on the real vLLM CPU engine (in-process, a tiny random model of SmolLM2's architecture), with
the real retriever and reward servers and real Redis: the same trajectories as the lock-step loop where generation
is deterministic, a group acknowledged once with all its rollouts, and a weight update among running trajectories
tagging each rollout with the weights that generated it.

Slow: the session's in-process engine (tests/common/engine.py), started by the first module that needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.policy.agent import LoopConfig, Sampling, Trajectory
from ragr1.services.policy.backends import RetrieverSearch, RewardServiceScorer
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.rollouts import build_rollouts, expand, task_of
from ragr1.services.policy.runtime import ASYNC, LOCKSTEP, Policy, RolloutLimits
from ragr1.services.policy.streaming import StreamingRolloutWorker
from ragr1.services.policy.weights import InFlight
from ragr1.v1 import common_pb2
from tests.common.engine import Engine, SharedEngine
from tests.common.waiting import wait_for_async
from tests.policy.test_integration import hotpot_tasks, perturbed_checkpoint
from tests.policy.test_worker import worker_settings

pytestmark = pytest.mark.slow

T = TypeVar("T")
# Passages enough for the layout; the budget itself is test_agent's.
LOOP = LoopConfig(max_turns=2, max_model_len=2048, tokens_per_query=64)
SEEDED = Sampling(temperature=1.0, top_p=1.0, max_tokens_per_turn=32, seed=11)
GREEDY = Sampling(temperature=0.0, top_p=1.0, max_tokens_per_turn=32)


@pytest.fixture(scope="module")
def engine(shared_engine: SharedEngine) -> Engine:
    vllm, loop = shared_engine.for_module()
    assert vllm.settings.max_model_len >= LOOP.max_model_len
    return vllm, loop


def on(engine: Engine, work: Awaitable[T]) -> T:
    return engine[1].run_until_complete(work)


def policy(engine: Engine, tokenizer: Any, search: RetrieverSearch, rollout_loop: str) -> Policy:
    vllm = engine[0]
    return Policy(vllm, tokenizer, search, LOOP, model_dir=vllm.model, default_sampling=SEEDED,
                  limits=RolloutLimits(), schedule=RolloutLoopSettings(rollout_loop=rollout_loop))


def search_of(retriever_server: ServiceProcess) -> RetrieverSearch:
    return RetrieverSearch(retriever_server.target, top_k=LOOP.top_k, timeout=60)


def prompts_with_samples() -> list[common_pb2.PromptTask]:
    tasks = hotpot_tasks(3)
    tasks[0].num_samples = 2
    return tasks


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_the_async_loop_gives_the_lock_step_trajectories(
    engine: Engine, tokenizer: Any, retriever_server: ServiceProcess, reward_server: ServiceProcess,
    sampling: Sampling,
) -> None:
    """The same ids, log-probs, masks, statuses and rewards from both loops over the same prompts (two samples
    of one): the turn logic is one, and seeds follow each trajectory's sample index."""
    messages = expand(prompts_with_samples(), 64)
    tasks = [task_of(m) for m in messages]

    async def both() -> dict[str, tuple[list[Trajectory], list[common_pb2.Rollout]]]:
        search, scorer = search_of(retriever_server), RewardServiceScorer(reward_server.target)
        out = {}
        for loop in (LOCKSTEP, ASYNC):
            trajectories = await policy(engine, tokenizer, search, loop).rollout(tasks, sampling)
            out[loop] = trajectories, await build_rollouts(trajectories, messages, tokenizer, scorer, sampling)
        await search.close()
        await scorer.close()
        return out

    runs = on(engine, both())
    (lockstep, lockstep_rollouts), (each, each_rollouts) = runs[LOCKSTEP], runs[ASYNC]
    assert [t.status for t in each] == [t.status for t in lockstep]
    assert [t.response_ids for t in each] == [t.response_ids for t in lockstep]
    assert [t.loss_mask for t in each] == [t.loss_mask for t in lockstep]
    for a, b in zip(lockstep, each, strict=True):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert [r.id for r in each_rollouts] == [r.id for r in lockstep_rollouts]
    assert [r.reward for r in each_rollouts] == [r.reward for r in lockstep_rollouts]
    if sampling.seed is not None:  # two samples of one prompt differ
        assert each[0].response_ids != each[1].response_ids


def test_a_group_is_acknowledged_once_with_all_its_rollouts(
    engine: Engine, tokenizer: Any, retriever_server: ServiceProcess, reward_server: ServiceProcess,
    redis_client: redis.Redis,
) -> None:
    """The async worker on the real engine, room for three trajectories: every prompt's rollouts (two samples
    of the first) reach the stream once, with its acknowledgement."""
    prompts = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w1")
    prompts.ensure_group()
    rollouts = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer")
    rollouts.ensure_group()
    tasks = prompts_with_samples()
    prompts.produce(tasks)

    async def scenario() -> list[common_pb2.Rollout]:
        search, scorer = search_of(retriever_server), RewardServiceScorer(reward_server.target)
        worker = StreamingRolloutWorker(
            policy(engine, tokenizer, search, ASYNC), scorer, prompts, rollouts, SEEDED,
            worker_settings(worker_batch=1, reclaim_idle_ms=600_000), max_in_flight=3,
        )
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        produced: list[common_pb2.Rollout] = []
        while len(produced) < 4 and not running.done():
            produced += [d.message for d in await asyncio.to_thread(rollouts.consume, 10, 200)]
        stop.set()
        await running
        await search.close()
        await scorer.close()
        return produced

    produced = on(engine, asyncio.wait_for(scenario(), 600))
    first = tasks[0].id
    assert sorted(r.id for r in produced) == sorted([f"{first}/0", f"{first}/1", *(f"{t.id}/0" for t in tasks[1:])])
    assert all(r.status != common_pb2.TRAJECTORY_STATUS_RETRIEVAL_ERROR for r in produced)
    assert redis_client.xlen(ROLLOUTS) == 4  # nothing produced twice
    assert prompts.pending() == 0 and all(prompts.is_done(t.id) for t in tasks)


def test_a_weight_update_among_running_trajectories_tags_each_with_the_weights_that_generated_it(
    engine: Engine, tokenizer: Any, retriever_server: ServiceProcess, tmp_path: Path,
) -> None:
    """Greedy trajectories run on their own; new weights arrive (finish) while some are in the engine, and more
    trajectories start meanwhile. Those running end on v0, those that started during the update wait for it and
    run on v1, and each one's tokens are exactly what its version's weights generate on their own."""
    served_model = engine[0].model
    changed = perturbed_checkpoint(served_model, tmp_path / "v1")
    first, second = [task_of(m) for m in hotpot_tasks(2)], [task_of(m) for m in hotpot_tasks(4)[2:]]

    async def scenario() -> tuple[list[Trajectory], list[Trajectory], list[Trajectory], list[Trajectory]]:
        search = search_of(retriever_server)
        served = policy(engine, tokenizer, search, ASYNC)
        early = asyncio.ensure_future(served.rollout(first, GREEDY))
        await wait_for_async(lambda: engine[0].occupancy.requests, "no early trajectory reached the engine", 300)
        update = asyncio.ensure_future(served.update_weights(1, str(changed), InFlight.FINISH))
        # The update holds the fence while it waits for the running trajectories: what starts now waits for it.
        await wait_for_async(lambda: served.gate.closed, "the update never closed the fence")
        late = await served.rollout(second, GREEDY)
        await update
        ran_early = await early
        # The references: each set alone on the weights its rollouts claim (v2 is v0's weights again).
        late_alone = await served.rollout(second, GREEDY)
        await served.update_weights(2, str(served_model), InFlight.FINISH)
        alone = await served.rollout([*first, *second], GREEDY)
        await search.close()
        return ran_early, late, alone, late_alone

    early, late, on_v0, late_alone = on(engine, asyncio.wait_for(scenario(), 600))
    assert {t.policy_version for t in early} == {0} and {t.policy_version for t in late} == {1}
    assert [t.response_ids for t in early] == [t.response_ids for t in on_v0[:2]]
    assert [t.response_ids for t in late] == [t.response_ids for t in late_alone]
    assert [t.response_ids for t in late] != [t.response_ids for t in on_v0[2:]]  # v1 is other weights
