"""The async rollout worker under the faults a cluster has every day, against real Redis and a real reward server
(the engine is the loop's scripted one): each test makes the fault happen and checks that it did, then that
nothing waited for ``reclaim_idle_ms`` (10 minutes here, as deployed): work that failed for a passing reason
goes back at once with a delivery counted and a backoff, and a group that runs longer than the reclaim time
keeps its lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from prometheus_client import REGISTRY

from ragr1.protocol.information import Passage
from ragr1.services.common.errors import Unavailable
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import RedisServer, free_port
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, Backlog, StreamQueue
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling
from ragr1.services.policy.backends import RewardServiceScorer
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import ASYNC, Policy, RolloutLimits
from ragr1.services.policy.streaming import StreamingRolloutWorker
from ragr1.services.policy.worker import backoff_seconds
from ragr1.v1 import common_pb2
from tests.common.waiting import holds_for_async, wait_for_async
from tests.policy.scripted import ScriptedSearch
from tests.policy.test_streaming import TimedEngine, async_policy, task
from tests.policy.test_worker import BACKOFF, worker_settings

RECLAIM_MS = 600_000


def requeues(reason: str) -> float:
    return REGISTRY.get_sample_value("ragr1_policy_worker_requeues_total", {"reason": reason}) or 0.0


def queues(client: redis.Redis, max_deliveries: int = 5) -> tuple[StreamQueue[Any], StreamQueue[Any]]:
    prompts = StreamQueue(client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w1",
                          max_deliveries=max_deliveries)
    prompts.ensure_group()
    rollouts = StreamQueue(client, ROLLOUTS, common_pb2.Rollout, group="trainer")
    rollouts.ensure_group()
    return prompts, rollouts


def worker(policy: Any, scorer: RewardServiceScorer, prompts: StreamQueue[Any], rollouts: StreamQueue[Any],
           reclaim_idle_ms: int = RECLAIM_MS) -> StreamingRolloutWorker:
    return StreamingRolloutWorker(policy, scorer, prompts, rollouts, Sampling(),
                                  worker_settings(reclaim_idle_ms=reclaim_idle_ms), max_in_flight=2)


async def until(condition: Callable[[], Any], what: str, seconds: float = 30.0) -> None:
    """Waits in the event loop (the worker runs in it) for ``condition()``, at most ``seconds``; the condition (a
    Redis call, which may block while a server restarts) runs off the loop, so the worker goes on meanwhile."""
    await wait_for_async(lambda: asyncio.to_thread(condition), what, seconds, 0.05)


def running(w: StreamingRolloutWorker, scenario: Callable[[], Awaitable[None]]) -> None:
    """Runs ``scenario`` while the worker runs, then stops the worker and closes its scorer."""
    async def go() -> None:
        stop = asyncio.Event()
        job = asyncio.ensure_future(w.run(stop))
        try:
            await scenario()
        finally:
            stop.set()
            await asyncio.wait_for(job, 10)
            await w.scorer.close()  # type: ignore[attr-defined]

    asyncio.run(asyncio.wait_for(go(), 120))


def gauge(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def down(dependency: str) -> float:
    return gauge("ragr1_policy_worker_dependency_down", dependency=dependency)


def test_a_score_call_that_fails_while_the_reward_service_is_down_costs_the_prompt_no_delivery(
    redis_client: redis.Redis, tokenizer: Any, policy_model_dir: Path, tmp_path: Path
) -> None:
    """The reward service is down when the group ends (a rolling restart): its Score call answers UNAVAILABLE, the
    prompt goes back at once with no delivery counted (with max_deliveries 1, a counted failure would have
    dead-lettered it), the worker takes nothing and reports not ready while the service is down, and once the
    service answers again the prompt is trained, within seconds, not after the reclaim time."""
    prompts, rollouts = queues(redis_client, max_deliveries=1)
    prompts.produce([task("fr", "Fast one?")])
    port = free_port()
    scorer = RewardServiceScorer(f"127.0.0.1:{port}")  # nothing listens there yet
    ready: list[bool] = []

    async def report(up: bool) -> None:
        ready.append(up)

    w = StreamingRolloutWorker(async_policy(TimedEngine(tokenizer), tokenizer, policy_model_dir), scorer, prompts,
                               rollouts, Sampling(), worker_settings(reclaim_idle_ms=RECLAIM_MS,
                                                                     dependency_probe_seconds=0.2),
                               max_in_flight=2, report_ready=report)

    async def scenario() -> None:
        await until(lambda: down("reward") == 1, "the worker never saw the reward service down")
        # Handed back, not held, and not taken again while the service is down: probes, not prompts.
        await holds_for_async(lambda: prompts.backlog() == Backlog(1, 0, 0),
                              "the prompt waits, handed back, while the reward service is down", 1.0)
        assert ready == [False]
        service = ServiceProcess.ragr1("reward", ["serve", "reward", "--port", str(port), "--metrics-port", "0"],
                                       f"127.0.0.1:{port}", tmp_path / "reward.log")
        await asyncio.to_thread(service.start)
        try:
            await until(lambda: prompts.is_done("fr"), "the prompt was never trained once the service was back")
        finally:
            await asyncio.to_thread(service.stop)

    started = time.monotonic()
    running(w, scenario)
    assert time.monotonic() - started < RECLAIM_MS / 1000
    assert ready == [False, True] and down("reward") == 0
    (rollout,) = [d.message for d in rollouts.consume(10)]
    assert rollout.task_id == "fr" and rollout.reward.f1 > 0
    assert prompts.pending() == 0 and prompts.dead_letters() == []


class DownSearch(ScriptedSearch):
    """A retriever that answers UNAVAILABLE (a shard reloading its index) until ``up`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False
        self.refused = 0

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        if not self.up:
            self.refused += 1
            raise Unavailable("1 of 2 shards did not answer")
        return await super().search(queries, groups)


def test_a_retriever_that_is_down_for_longer_than_the_retry_budget_dead_letters_no_prompt(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """A retriever down for longer than a prompt's retry budget (max_deliveries 2, backoffs of 0.2 s): every search
    in that time fails, and none counts against the prompt. The worker stops taking prompts until a probe finds
    the retriever answering again; then the prompt is trained, and nothing was dead-lettered."""
    prompts, rollouts = queues(redis_client, max_deliveries=2)
    prompts.produce([task("slow", "Slow one?")])  # searches once
    search = DownSearch()
    policy = Policy(TimedEngine(tokenizer), tokenizer, search, LoopConfig(), model_dir=policy_model_dir,
                    default_sampling=Sampling(), limits=RolloutLimits(max_batch=8),
                    schedule=RolloutLoopSettings(rollout_loop=ASYNC))
    w = StreamingRolloutWorker(policy, RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                               worker_settings(reclaim_idle_ms=RECLAIM_MS, dependency_probe_seconds=0.2),
                               max_in_flight=2)

    async def scenario() -> None:
        await until(lambda: down("retriever") == 1, "the worker never saw the retriever down")
        # Down for many backoffs and probes: the prompt's one failure and the probes' all refused.
        await wait_for_async(lambda: search.refused >= 8, "the worker stopped asking the retriever", 10, 0.05)
        assert prompts.backlog() == Backlog(1, 0, 0) and prompts.dead_letters() == []
        search.up = True
        await until(lambda: prompts.is_done("slow"), "the prompt was never trained once the retriever was back")

    running(w, scenario)
    assert down("retriever") == 0 and prompts.dead_letters() == [] and prompts.pending() == 0
    assert [d.message.task_id for d in rollouts.consume(10)] == ["slow"]


class WedgedEngine(TimedEngine):
    """An engine whose process is stopped: a generation it was given never comes back."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.given = 0

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        self.given += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_a_replica_whose_engine_hangs_lets_its_prompts_go_once_they_make_no_progress_for_the_stall_limit(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """The engine takes the group's generation and never answers (a stopped engine process): the worker renews the
    prompt's lease for stall_seconds (1.5 s; another worker looking every 0.1 s finds nothing to take meanwhile),
    then lets it lapse, and the other worker takes it one reclaim time (1 s) later, its delivery counted."""
    stall, reclaim_ms = 1.5, 1000
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("fr", "Fast one?")])
    engine = WedgedEngine(tokenizer)
    w = StreamingRolloutWorker(async_policy(engine, tokenizer, policy_model_dir),
                               RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                               worker_settings(reclaim_idle_ms=reclaim_ms, stall_seconds=stall), max_in_flight=2)
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    lapsed_before = gauge("ragr1_policy_worker_leases_lapsed_total")
    taken: list[Any] = []
    times: list[float] = []

    async def scenario() -> None:
        await wait_for_async(lambda: engine.given == 1, "the engine was never given the group", 10, 0.05)
        given = time.monotonic()

        async def reclaimed() -> bool:
            taken.extend(await asyncio.to_thread(other.reclaim, reclaim_ms, 10))
            return bool(taken)

        await wait_for_async(reclaimed, "the stalled prompt was never let go", 30, 0.1)
        times.append(time.monotonic() - given)

    running(w, scenario)
    assert engine.given == 1  # the fault: a generation given and never answered
    assert stall <= times[0] < stall + reclaim_ms / 1000 + 2 * reclaim_ms / 1000 / 4 + 2
    (d,) = taken
    assert d.message.id == "fr" and d.deliveries == 2
    assert gauge("ragr1_policy_worker_leases_lapsed_total") == lapsed_before + 1
    assert rollouts.consume(10) == []


def test_a_prompt_waiting_for_room_goes_back_when_the_replica_stops_accepting(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """Room for two trajectories, one running: the second prompt taken, of two samples, waits for room. A new version
    to load clears ``accepting``: the waiting prompt goes back at once, no delivery counted, for a replica that can
    start it, while the running group goes on."""
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("a", "Fast one?"), task("b", "Fast one?", samples=2)])
    engine = WedgedEngine(tokenizer)
    accepting = asyncio.Event()
    accepting.set()
    w = StreamingRolloutWorker(async_policy(engine, tokenizer, policy_model_dir),
                               RewardServiceScorer(reward_server.target), prompts, rollouts, Sampling(),
                               worker_settings(reclaim_idle_ms=RECLAIM_MS), accepting=accepting, max_in_flight=2)

    async def scenario() -> None:
        await until(lambda: prompts.backlog() == Backlog(0, 2, 1), "the worker never held both prompts")
        assert engine.given == 1  # one running, one waiting for room
        accepting.clear()
        await until(lambda: prompts.backlog() == Backlog(1, 1, 1), "the waiting prompt was never handed back", 5)

    running(w, scenario)
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    handed = other.reclaim(RECLAIM_MS, 10)  # the leave handed back the running one too
    assert sorted(d.message.id for d in handed) == ["a", "b"] and [d.deliveries for d in handed] == [1, 1]


def test_an_acknowledgement_redis_refuses_hands_the_prompt_back_and_nothing_is_produced_twice(
    redis_server: RedisServer, redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any,
    policy_model_dir: Path,
) -> None:
    """Redis refuses the worker's acknowledgement (its user may not XACK for a while): the transaction that would
    have produced the rollouts and acknowledged the prompt does nothing, the prompt goes back at once, and once
    acknowledgements pass again it is trained, its rollout produced once."""
    redis_client.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-xack")
    client = redis.Redis(host=redis_server.host, port=redis_server.port, username="worker", password="pw")
    try:
        prompts, rollouts = queues(client, max_deliveries=50)
        prompts.produce([task("fr", "Fast one?")])
        w = worker(async_policy(TimedEngine(tokenizer), tokenizer, policy_model_dir),
                   RewardServiceScorer(reward_server.target), prompts, rollouts)
        refused_before = requeues("acknowledgement")

        async def scenario() -> None:
            await until(lambda: requeues("acknowledgement") > refused_before, "no acknowledgement was refused")
            assert redis_client.xlen(ROLLOUTS) == 0  # the refused transaction produced nothing
            redis_client.execute_command("ACL", "SETUSER", "worker", "+xack")
            await until(lambda: prompts.is_done("fr"), "the prompt was never trained once acknowledgements passed")

        started = time.monotonic()
        running(w, scenario)
        assert time.monotonic() - started < RECLAIM_MS / 1000
        assert [d.message.task_id for d in rollouts.consume(10)] == ["fr"]
        assert prompts.pending() == 0
    finally:
        client.close()
        redis_client.execute_command("ACL", "DELUSER", "worker")


class BrokenEngine(TimedEngine):
    """Fails every generation, as an engine whose process went away does."""

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        raise RuntimeError("the engine is gone")


def test_a_rollout_that_keeps_failing_counts_a_delivery_each_time_with_a_growing_backoff_then_is_dead_lettered(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """A rollout that raises hands its prompt back with a delivery counted, not to be taken again before its
    backoff (which doubles): the failing replica does not take it back at once for good. On its
    max_deliveries-th failure the prompt is dead-lettered with what failed."""
    prompts, rollouts = queues(redis_client, max_deliveries=4)
    prompts.produce([task("fr", "Fast one?")])
    w = worker(async_policy(BrokenEngine(tokenizer), tokenizer, policy_model_dir),
               RewardServiceScorer(reward_server.target), prompts, rollouts)

    async def scenario() -> None:
        await until(lambda: prompts.dead_letters(), "never dead-lettered")

    started = time.monotonic()
    running(w, scenario)
    elapsed = time.monotonic() - started
    (dead,) = prompts.dead_letters()
    assert dead["id"] == "fr" and "the engine is gone" in dead["reason"] and "delivery 4" in dead["reason"]
    # Three hand-backs before it: each waited out its backoff, so the four deliveries took at least their sum.
    waits = sum(backoff_seconds(n, BACKOFF["retry_backoff_seconds"], BACKOFF["retry_backoff_max_seconds"])
                for n in (1, 2, 3))
    assert waits <= elapsed < RECLAIM_MS / 1000
    assert rollouts.consume(10) == [] and prompts.pending() == 0


class SlowEngine(TimedEngine):
    """Each generation takes ``seconds``: a group that runs as long as a long trajectory of a large model."""

    def __init__(self, tokenizer: Any, seconds: float) -> None:
        super().__init__(tokenizer)
        self.seconds = seconds

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        await asyncio.sleep(self.seconds)
        return await super().generate(requests, sampling, stop)


def test_a_group_that_runs_longer_than_the_reclaim_time_keeps_its_lease(
    redis_client: redis.Redis, reward_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path
) -> None:
    """reclaim_idle_ms 1 s and a group of 4 s: the worker renews its lease on the prompt while the group runs, so
    another worker's reclaim finds nothing to take, however often it looks; the group ends and is acknowledged
    once by its owner."""
    reclaim_ms = 1000
    prompts, rollouts = queues(redis_client)
    prompts.produce([task("slow", "Slow one?")])  # two turns of 2 s each
    w = worker(async_policy(SlowEngine(tokenizer, 2.0), tokenizer, policy_model_dir),
               RewardServiceScorer(reward_server.target), prompts, rollouts, reclaim_idle_ms=reclaim_ms)
    other = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w2")
    stolen: list[Any] = []
    held_for: list[float] = []

    async def scenario() -> None:
        await until(lambda: prompts.backlog().in_progress == 1, "the prompt was never taken")
        taken = time.monotonic()
        async def stolen_until_done() -> bool:  # however often another worker looks, until the group ends
            stolen.extend(await asyncio.to_thread(other.reclaim, reclaim_ms, 10))
            return await asyncio.to_thread(prompts.is_done, "slow")

        await wait_for_async(stolen_until_done, "the slow group never ended", 60, 0.1)
        held_for.append(time.monotonic() - taken)

    running(w, scenario)
    assert held_for[0] > 3 * reclaim_ms / 1000  # the fault: the group ran past the reclaim time, three times over
    assert stolen == []  # and it was never taken from its live owner
    assert [d.message.task_id for d in rollouts.consume(10)] == ["slow"]
    assert prompts.pending() == 0
