"""Trainer.Status over real gRPC, and weight versions announced to the policy replicas through Redis: the
loop on real Redis with a stand-in updater (no model), the replicas' reports written as a replica writes them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis
from safetensors.numpy import save_file

from ragr1.model_paths import policy_checkpoint
from ragr1.services.common import fleet
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.server import GrpcServer
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir
from ragr1.services.trainer.client import TrainerClient
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop import PPOLoop, TrainerStatus
from ragr1.services.trainer.publisher import PublishError, WeightPublisher
from ragr1.services.trainer.servicer import TrainerServicer
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import Sample
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc
from tests.common.waiting import wait_for
from tests.trainer.rollouts import _tasks, make_rollout, produce, tiny_config


class StandInUpdater:
    """Trains nothing: each update's weights are a small safetensors file of its own (so each version has its
    own digest) and no trainer state, so that these tests need no model."""

    def __init__(self) -> None:
        self.updates = 0

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        self.updates += 1
        return {"policy_loss": 0.0, "update_seconds": 0.0}

    def state(self) -> None:
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def save_policy(self, directory: Path) -> None:
        (directory / "config.json").write_text("{}")
        save_file({"w": np.full((4,), float(self.updates), dtype=np.float32)}, str(directory / "model.safetensors"))

    def close(self) -> None:
        pass


def publishing_loop(client: redis.Redis, out: Path, timeout: float = 60.0, **overrides: object) -> PPOLoop:
    config = tiny_config(**{"fleet_poll_seconds": 0.01, **overrides})
    return PPOLoop(config, client, _tasks(), StandInUpdater(), Checkpointer(out / "checkpoints", keep=10),  # type: ignore[arg-type]
                   StepLog(out / "steps.jsonl"), WeightPublisher(client, timeout))


def announced(client: redis.Redis) -> list[fleet.Announcement]:
    return [fleet.Announcement.read(e, f) for e, f in client.xrange(fleet.WEIGHTS)]  # type: ignore[union-attr]


def latest_version(client: redis.Redis) -> int:
    return (fleet.latest(client) or fleet.Announcement(0, "", "")).version


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


def test_each_version_is_announced_once_with_its_checkpoint_and_digest(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The trainer needs no replica address: the weights it starts from are announced as v0, then each version
    after its checkpoint is on disk, with the digest the replicas check what they read against (written once,
    at save)."""
    loop = publishing_loop(redis_client, tmp_path, batch_size=2, max_updates=2)
    produce(redis_client, [make_rollout(f"r{i}") for i in range(4)])
    assert run_loop(loop) is None
    versions = Checkpointer(tmp_path / "checkpoints").versions()
    assert versions == [1, 2]
    start, *entries = announced(redis_client)
    start_weights = policy_checkpoint(loop.config.model)
    assert (start.version, start.path, start.sha256) == (0, str(start_weights), checkpoint_sha256(start_weights))
    assert [a.version for a in entries] == [1, 2]
    for a, version in zip(entries, versions, strict=True):
        served = policy_dir(tmp_path / "checkpoints" / f"v{version:06d}")
        assert a.path == str(served.resolve()) and a.sha256 == checkpoint_sha256(served)
    assert entries[0].sha256 != entries[1].sha256
    assert [r["announced"]["version"] for r in loop.steps.read()] == [1, 2]
    assert fleet.latest(redis_client) == entries[-1]


def test_a_restarted_trainer_announces_only_what_redis_lacks(redis_client: redis.Redis, tmp_path: Path) -> None:
    """Restarted, the trainer announces nothing twice (its starting weights as v0, then v1); with its
    announcement gone (the trainer died between saving and announcing, or Redis lost it) it announces its
    latest checkpoint again."""
    produce(redis_client, [make_rollout("r0")])
    assert run_loop(publishing_loop(redis_client, tmp_path, batch_size=1, max_updates=1)) is None
    for _restart in range(3):
        again = publishing_loop(redis_client, tmp_path, batch_size=1, max_updates=1)
        assert run_loop(again) is None and again.version == 1
    assert [a.version for a in announced(redis_client)] == [0, 1]
    redis_client.delete(fleet.WEIGHTS)
    assert run_loop(publishing_loop(redis_client, tmp_path, batch_size=1, max_updates=1)) is None
    (entry,) = announced(redis_client)
    assert entry.version == 1 and entry.sha256 == Checkpointer(tmp_path / "checkpoints").policy_sha256(
        tmp_path / "checkpoints" / "v000001")


def test_a_trainer_behind_what_redis_announces_stops_before_training(redis_client: redis.Redis, tmp_path: Path) -> None:
    """Another run's announcements (or lost checkpoints): the replicas would serve weights this trainer never
    wrote, and refuse every version it announces below them."""
    fleet.announce(redis_client, 5, "/elsewhere/v000005/policy", "ab" * 32)
    produce(redis_client, [make_rollout("r0")])
    loop = publishing_loop(redis_client, tmp_path, batch_size=1, max_updates=1)
    raised = run_loop(loop)
    assert isinstance(raised, PublishError), raised
    assert "Redis announces weights v5" in str(raised) and fleet.WEIGHTS in str(raised)
    assert loop.version == 0 and not (tmp_path / "checkpoints").exists()


def test_a_fleet_that_keeps_refusing_the_version_stops_the_trainer_with_the_reason(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Every replica refused version 1 (its digest did not match what they read). A refusal alone stops nothing
    (the replicas retry it: shared storage may show the checkpoint late); once no replica has served v1 for
    weights_timeout_seconds the trainer stops, naming each replica's reason, instead of waiting for good."""
    refused_at: list[float] = []

    def replicas_refuse_version_1() -> None:
        wait_for(lambda: latest_version(redis_client) >= 1, "version 1 was never announced", 60, 0.02)
        for name in ("policy-0", "policy-1"):
            fleet.report(redis_client, fleet.ReplicaReport(name, 0, fleet.REFUSED, 1, "its weights hash to sha256 00"),
                         60)
        refused_at.append(time.monotonic())

    timeout = 1.5
    loop = publishing_loop(redis_client, tmp_path, timeout=timeout, batch_size=1, max_updates=3)
    produce(redis_client, [make_rollout("r0")])
    raised = run_loop(loop, replicas_refuse_version_1)
    stopped_after = time.monotonic() - refused_at[0]
    assert isinstance(raised, PublishError), raised
    assert f"no policy replica has served weights v1 for {timeout:g} s" in str(raised)
    assert "policy-0 serves v0, refused v1: its weights hash to sha256 00" in str(raised)
    assert stopped_after >= timeout - 0.1
    assert loop.version == 1


def test_a_fleet_that_never_loads_the_version_stops_the_trainer_after_the_timeout(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A replica that reports but stays behind (loading for good: a hung shared volume) stops the trainer once
    weights_timeout_seconds have passed without any replica serving the announced version."""

    def a_replica_stuck_loading() -> None:
        wait_for(lambda: latest_version(redis_client) >= 1, "version 1 was never announced", 60, 0.02)
        fleet.report(redis_client, fleet.ReplicaReport("policy-0", 0, fleet.LOADING, 1), 60)

    loop = publishing_loop(redis_client, tmp_path, timeout=0.5, batch_size=1, max_updates=3)
    produce(redis_client, [make_rollout("r0")])
    raised = run_loop(loop, a_replica_stuck_loading)
    assert isinstance(raised, PublishError), raised
    assert "no policy replica has served weights v1 for 0.5 s" in str(raised)
    assert "policy-0 serves v0, loading v1" in str(raised)
