"""The policy gRPC server: the vLLM engine, the agent loop, and (``--worker``) the rollout worker."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import redis

from ragr1.model_paths import policy_checkpoint
from ragr1.protocol.prompts import Tokenizer
from ragr1.services.common.server import GrpcServer
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.policy import metrics
from ragr1.services.policy.agent import Sampling
from ragr1.services.policy.backends import RetrieverSearch, RewardServiceScorer
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.policy.engine import VllmEngine
from ragr1.services.policy.follower import WeightFollower
from ragr1.services.policy.loops import WORKERS
from ragr1.services.policy.runtime import Policy
from ragr1.services.policy.servicer import PolicyServicer
from ragr1.services.policy.streaming import LENGTH_WINDOW, EngineBatch, StreamingRolloutWorker, resolve_max_in_flight
from ragr1.services.policy.worker import RolloutWorker
from ragr1.v1 import common_pb2, policy_pb2_grpc

log = logging.getLogger(__name__)


class Checked(Protocol):
    async def check_health(self) -> None: ...

    def stalled_seconds(self) -> float: ...


class EngineDied(RuntimeError):
    """The vLLM engine stopped answering its health check, or stopped making steps: it never comes back."""


async def watch_engine(engine: Checked, server: GrpcServer, interval: float, stall_seconds: float) -> None:
    """Ties the server's health to the engine. A vLLM engine that died (its process killed, a kernel that failed)
    never comes back and fails every request; one that has had requests and made no step for ``stall_seconds``
    (an engine process stopped, a collective that never returns) holds them for good, and vLLM's own check does
    not see it. Either way the server turns NOT_SERVING and this raises, which stops the process with exit code 1:
    the rollout worker hands back every prompt it holds as it leaves, and the container restarts instead of
    showing healthy while it serves nothing."""
    looked = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        # A look that comes more than an interval late finds this process itself was stopped or starved (SIGSTOP,
        # a host that did not schedule it): the engine's outputs of that time are still unread, so its stall clock
        # says nothing until the next look.
        late = time.monotonic() - looked > 2 * interval
        looked = time.monotonic()
        try:
            await engine.check_health()
            stalled = engine.stalled_seconds()
            if stalled > stall_seconds and not late:
                raise TimeoutError(f"no step for {stalled:.0f} s with requests in hand (stall_seconds "
                                   f"{stall_seconds:g})")
        except Exception as exc:
            log.error("the vLLM engine died (%s: %s); the policy goes NOT_SERVING and stops",
                      type(exc).__name__, exc)
            await server.set_serving(False)
            raise EngineDied(f"{type(exc).__name__}: {exc}") from exc


def worker_name(config: PolicyConfig) -> str:
    """The replica's name on the prompts stream and in the fleet. Deployments set a stable one per replica
    (see PolicyConfig.worker_name); host-pid is unique but changes with every restart."""
    return config.worker_name or f"{socket.gethostname()}-{os.getpid()}"


class Batching(Protocol):
    def sequences_at_once(self, tokens_per_sequence: int) -> int: ...


def build_worker(
    config: PolicyConfig, policy: Policy, scorer: RewardServiceScorer, client: redis.Redis, name: str,
    accepting: asyncio.Event | None = None, *, engine: Batching,
    report_ready: Callable[[bool], Awaitable[None]] | None = None,
) -> RolloutWorker:
    """The worker of a replica, the one ``loops.WORKERS`` gives the policy's rollout loop: asked to stop, it finishes
    or hands back what it holds within the grace period (``RolloutWorker``, ``StreamingRolloutWorker``). The async
    worker keeps as many trajectories running as ``engine`` runs at once (``EngineBatch``), unless
    ``max_in_flight`` caps them."""
    prompts = StreamQueue(
        client,
        PROMPTS,
        common_pb2.PromptTask,
        group=config.worker_group,
        consumer=name,
        max_deliveries=config.max_deliveries,
    )
    prompts.ensure_group()
    rollouts = StreamQueue(client, ROLLOUTS, common_pb2.Rollout, group=config.worker_group)
    worker_class = WORKERS[policy.rollout_loop]
    parts = (policy, scorer, prompts, rollouts, Sampling.of(config), config.worker_settings())
    if not issubclass(worker_class, StreamingRolloutWorker):
        return worker_class(*parts, accepting=accepting, report_ready=report_ready)
    max_in_flight = resolve_max_in_flight(
        config.max_in_flight, EngineBatch(engine.sequences_at_once, config.trajectory_tokens(), LENGTH_WINDOW))
    worker = worker_class(*parts, accepting=accepting, report_ready=report_ready, max_in_flight=max_in_flight)
    log.info("rollout worker %s keeps %s %d trajectories running (max_in_flight %d; max_num_seqs %d, "
             "trajectories of up to %d tokens)", name, "at most" if config.max_in_flight else "its engine's",
             worker.max_in_flight, config.max_in_flight, config.max_num_seqs, config.trajectory_tokens())
    metrics.WORKER_MAX_IN_FLIGHT.set(worker.max_in_flight)
    return worker


async def build_server(config: PolicyConfig) -> GrpcServer:
    """The engine loaded, the agent loop wired to the retriever and the reward service, and with
    ``worker`` on the rollout worker beside the server. Async: vLLM's engine starts inside the event loop
    that serves."""
    from transformers import AutoTokenizer

    path = policy_checkpoint(config.model)
    tokenizer = cast(Tokenizer, AutoTokenizer.from_pretrained(str(path)))
    engine = VllmEngine.start(config, path)
    search = RetrieverSearch(
        config.retriever_address,
        top_k=config.top_k,
        timeout=config.retrieval_timeout_seconds,
        dedup_within_group=config.dedup_within_group,
    )
    scorer = RewardServiceScorer(config.reward_address) if config.reward_address else None
    policy = Policy(
        engine,
        tokenizer,
        search,
        config,
        model_dir=path,
        default_sampling=Sampling.of(config),
        limits=config,
        on_weight_update=config.weight_update_policy(),
        engine_seed=config.seed,
        schedule=config,
    )
    # A rollout worker is ready once it serves the announced weights (``WeightFollower``), not at its start.
    server = GrpcServer(config, "policy", ready_at_start=not config.worker)
    server.add(policy_pb2_grpc.add_PolicyServicer_to_server, PolicyServicer(policy, scorer))
    server.beside(lambda: watch_engine(engine, server, config.engine_check_seconds, config.stall_seconds),
                  "the engine watchdog")
    if config.worker:
        assert scorer is not None  # the config requires reward_address with worker
        client, name = config.redis_client(), worker_name(config)
        follower = WeightFollower(policy, client, name, config.follower_settings(), set_serving=server.set_serving)
        # Not ready while a dependency is down; once it answers, ready again if it serves the announced weights.
        async def report_ready(up: bool) -> None:
            await server.set_serving(up and follower.accepting.is_set())

        worker = build_worker(config, policy, scorer, client, name, follower.accepting, engine=engine,
                              report_ready=report_ready)
        stop_worker, stop_follower = asyncio.Event(), asyncio.Event()
        # Asked to stop, the worker finishes or hands back its batch within the grace period (``build_worker``).
        server.beside(lambda: worker.run(stop_worker), "the rollout worker", stop=stop_worker.set,
                      stop_seconds=config.grace_seconds)
        # A load in hand gets the grace period too; then the replica leaves the fleet.
        server.beside(lambda: follower.run(stop_follower), "the weight follower", stop=stop_follower.set,
                      stop_seconds=config.grace_seconds)
        log.info("rollout worker %s consuming %s once it serves the newest announced weights", name, PROMPTS)

    async def close() -> None:
        await search.close()
        if scorer is not None:
            await scorer.close()
        engine.shutdown()

    server.on_stop(close)
    return server


async def serve(config: PolicyConfig) -> int:
    """Serves until SIGTERM (exit code 0) or until the engine dies (exit code 1)."""
    server = await build_server(config)
    return await server.serve()
