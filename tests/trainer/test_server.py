"""Trainer.Status over real gRPC, and weight versions sent to policy replicas by UpdateWeights."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import redis

from ragr1.services.common.redis_server import free_port
from ragr1.services.common.server import GrpcServer
from ragr1.services.trainer.client import TrainerClient
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop.ppo_loop import PPOLoop, TrainerStatus
from ragr1.services.trainer.publisher import PublishError, WeightPublisher
from ragr1.services.trainer.servicer import TrainerServicer
from ragr1.v1 import policy_pb2, policy_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.trainer.rollouts import make_loop, make_rollout, produce


class RecordingPolicy(policy_pb2_grpc.PolicyServicer):
    """Stands in for a policy replica: records the versions it is told to load and refuses one that is not
    newer, as the real policy does (which, with auth and TLS, is in tests/policy/test_integration.py).
    ``refuse`` answers every update like a policy whose token the trainer does not have."""

    def __init__(self, refuse: bool = False) -> None:
        self.updates: list[policy_pb2.UpdateWeightsRequest] = []
        self.refuse = refuse
        self.version = 0

    def UpdateWeights(self, request, context):  # type: ignore[no-untyped-def]
        if self.refuse:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        if request.version <= self.version:  # as the real policy does
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version must be greater than the current {self.version}")
        self.updates.append(request)
        self.version = request.version
        return policy_pb2.UpdateWeightsResponse(version=request.version)

    def GetWeightVersion(self, request, context):  # type: ignore[no-untyped-def]
        return policy_pb2.GetWeightVersionResponse(version=self.version)


@contextlib.contextmanager
def policy_replica(policy: RecordingPolicy) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    policy_pb2_grpc.add_PolicyServicer_to_server(policy, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def run_loop(loop: PPOLoop, meanwhile: Callable[[], None] | None = None) -> BaseException | None:
    """Runs the loop in a thread, as the trainer's server does (``meanwhile`` in this one); returns what
    it raised."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            loop.run()
        except BaseException as exc:
            raised.append(exc)

    runner = threading.Thread(target=target)
    runner.start()
    if meanwhile is not None:
        meanwhile()
    runner.join(120)
    assert not runner.is_alive()
    return raised[0] if raised else None


def test_status_reports_the_loop_state_over_grpc() -> None:
    status = TrainerStatus(
        stage="ppo",
        step=3,
        policy_version=3,
        rollouts_trained=48,
        rollouts_dropped_stale=2,
        last_mean_reward=0.25,
        checkpoint_path="/ck/v000003",
    )

    def ask(port: int) -> trainer_pb2.StatusResponse:
        with TrainerClient(f"127.0.0.1:{port}") as client:
            assert client.health()
            return client.status(timeout=5)

    async def scenario() -> trainer_pb2.StatusResponse:
        server = GrpcServer(PPOConfig(port=0, metrics_port=0), "trainer")
        server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(status))
        await server.start()
        try:
            return await asyncio.to_thread(ask, server.port)
        finally:
            await server.stop()

    r = asyncio.run(scenario())
    assert (r.stage, r.step, r.policy_version, r.rollouts_trained, r.rollouts_dropped_stale) == ("ppo", 3, 3, 48, 2)
    assert r.last_mean_reward == 0.25 and r.checkpoint_path == "/ck/v000003"


def test_each_update_is_published_to_every_replica_and_a_dead_one_does_not_stop_training(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A replica that is down makes no rollouts and is sent the version when it is back: even with
    max_failures 1 it does not stop the trainer (a refusing one does: the next test)."""
    policy = RecordingPolicy()
    dead = f"127.0.0.1:{free_port()}"
    with policy_replica(policy) as live:
        loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=2, max_updates=2)
        loop.publisher = WeightPublisher([live, dead], timeout=5, max_failures=1)
        produce(redis_client, [make_rollout(f"r{i}") for i in range(4)])
        assert run_loop(loop) is None
    assert [u.version for u in policy.updates] == [1, 2]
    for update in policy.updates:
        served = Path(update.checkpoint_path)
        assert (served / "model.safetensors").exists() and not list(served.glob("*.pt"))
    records = loop.steps.read()
    assert [r["published"][live] for r in records] == ["ok", "ok"]
    assert all(r["published"][dead].startswith("UNAVAILABLE") for r in records)


def test_a_replica_that_keeps_refusing_updates_stops_the_trainer_with_the_reason(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A policy that refuses the trainer's token would keep serving version 0 while the trainer trains
    on, and every rollout would end up stale: the trainer stops after max_failures pushes instead."""
    with policy_replica(RecordingPolicy(refuse=True)) as refusing:
        loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=1, max_updates=5)
        loop.publisher = WeightPublisher([refusing], timeout=5, max_failures=2)
        produce(redis_client, [make_rollout(f"r{i}") for i in range(5)])
        raised = run_loop(loop)
    assert isinstance(raised, PublishError), raised
    message = str(raised)
    assert f"policy replica {refusing} failed 2 weight updates in a row" in message
    assert "UNAUTHENTICATED" in message and "RAGR1_CLIENT_TOKEN_FILE" in message
    assert loop.version == 2  # two updates, both refused, then no more training


def test_a_replica_that_restarted_at_version_0_is_sent_the_current_version_again(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A policy replica restarted by its supervisor serves its starting weights as version 0: every rollout
    it makes would be stale, no batch would come and the trainer would never push again. While collecting,
    the loop finds it behind and pushes the current version."""
    policy = RecordingPolicy()

    def restart_after_the_first_update() -> None:
        deadline = time.monotonic() + 60
        while policy.version < 1:
            assert time.monotonic() < deadline, "the first update never reached the replica"
            time.sleep(0.05)
        policy.version = 0  # the replica restarted
        while len(policy.updates) < 2:
            assert time.monotonic() < deadline, "the restarted replica was never sent the current version"
            time.sleep(0.05)
        assert policy.version == 1
        produce(redis_client, [make_rollout("r1")])  # only now: the second update follows the re-push

    with policy_replica(policy) as live:
        loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=1, max_updates=2,
                         resync_seconds=0.01)
        loop.publisher = WeightPublisher([live], timeout=5, max_failures=3)
        produce(redis_client, [make_rollout("r0")])
        assert run_loop(loop, restart_after_the_first_update) is None
    assert [u.version for u in policy.updates] == [1, 1, 2]
    assert policy.updates[1].checkpoint_path == policy.updates[0].checkpoint_path


def test_a_restarted_trainer_sends_its_version_only_to_the_replicas_behind(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """At resume, a replica that serves the trainer's version already is left alone (the policy refuses a
    version it serves, and counting that stopped a trainer restarted three times); one that restarted
    meanwhile, back at version 0, gets it."""
    policy = RecordingPolicy()
    with policy_replica(policy) as live:
        first = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=1, max_updates=1)
        first.publisher = WeightPublisher([live], timeout=5, max_failures=1)
        produce(redis_client, [make_rollout("r0")])
        assert run_loop(first) is None
        for _restart in range(3):
            again = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=1, max_updates=1)
            again.publisher = WeightPublisher([live], timeout=5, max_failures=1)
            assert run_loop(again) is None and again.version == 1
        assert [u.version for u in policy.updates] == [1]
        policy.version = 0  # the replica restarted too
        again = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=1, max_updates=1)
        again.publisher = WeightPublisher([live], timeout=5, max_failures=1)
        assert run_loop(again) is None
    assert [u.version for u in policy.updates] == [1, 1] and policy.version == 1
