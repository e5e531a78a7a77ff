"""The Ray Train path: 2 CPU workers (gloo) on one worker group for the whole run take the same updates as
1 process, through the queue loop on a real Redis, FSDP-sharded and as whole copies, both built in turn on the
module's one worker group (as a group outlives the updater built on it).
Slow (the worker group's start-up, once for the module; Ray itself starts once for the module)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from ragr1.services.trainer.checkpoint import Checkpointer, version_dir
from ragr1.services.trainer.loop import Updater, to_sample
from ragr1.services.trainer.ray_train import (
    BUILD,
    LOAD,
    UPDATE,
    RayUpdater,
    WorkerGroup,
    WorkerRequests,
    build_request,
)
from ragr1.services.trainer.updater import PPOUpdater
from ragr1.v1 import common_pb2
from tests.trainer.rollouts import make_loop, make_rollout, produce, tiny_settings

UPDATES, BATCH = 3, 6


def _rollouts() -> list[common_pb2.Rollout]:
    # Scores 0, 1, 2 in every batch (something to learn); lengths differ, so the workers' shares differ.
    return [make_rollout(f"r{i}", score=float(i % 3), seed=i, generated=3 + i % 4) for i in range(UPDATES * BATCH)]


def _train(redis_client: redis.Redis, model_dir: Path, out: Path, updater: Updater) -> list[dict[str, object]]:
    """UPDATES updates through the loop on the same rollouts; returns the steps it logged."""
    redis_client.flushall()
    produce(redis_client, _rollouts())
    loop = make_loop(
        redis_client, model_dir, out, updater, batch_size=BATCH, max_updates=UPDATES, max_staleness=UPDATES
    )
    assert loop.run() == UPDATES
    return [dict(step) for step in loop.steps.read()]


def _assert_same(expected: dict[str, Any], got: dict[str, Any], start: dict[str, Any]) -> None:
    for model in ("actor", "critic"):
        moved = 0.0
        for name, value in expected[model].items():
            assert torch.allclose(got[model][name], value, atol=1e-5, rtol=1e-4), f"{model}: {name}"
            moved = max(moved, float((value - start[model][name]).abs().max()))
        assert moved > 1e-4, f"the updates did not change the {model}; the comparison would be vacuous"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@dataclasses.dataclass
class Group:
    """The module's worker group, and the rank-0 processes that answered the updaters built on it."""

    workers: WorkerGroup
    served_by: set[int] = dataclasses.field(default_factory=set)


@pytest.fixture(scope="module")
def group(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    shared = Group(WorkerGroup(tiny_settings(), num_workers=2, tmp_dir=tmp_path_factory.mktemp("ray")))
    try:
        yield shared
    finally:
        shared.workers.close()
    assert not shared.workers.thread.is_alive()


def _no_reduce(tensor: torch.Tensor, op: str) -> None:
    raise AssertionError("one whole copy reduces nothing")


def test_a_worker_refuses_requests_before_its_models_are_built_then_serves_them(tiny_model_dir: Path) -> None:
    # What a worker does with each request, without Ray: a LOAD or UPDATE that came before any BUILD (a driver
    # that lost its updater's BUILD) is refused by name, not served on models that do not exist.
    requests = WorkerRequests(torch.device("cpu"), rank=0, world=1, reduce=_no_reduce)
    for kind in (LOAD, UPDATE):
        with pytest.raises(RuntimeError, match=f"a '{kind}' request before any 'build'"):
            requests.serve(kind, {})
    with pytest.raises(ValueError, match="unknown request 'stop-now'"):
        requests.serve("stop-now", {})
    assert requests.served == 0
    settings = tiny_settings(sharding="replicate", seed=5)
    built = requests.serve(BUILD, build_request(settings, tiny_model_dir))
    assert built["kind"] == BUILD and built["served"] == 1 and built["sharded"] is False
    # Another run's state, its weights moved off the model's: the worker's models must hold it after LOAD.
    other = PPOUpdater.build(settings, tiny_model_dir).state()
    other["updates"] = 7
    other["actor"] = {key: tensor + 0.5 for key, tensor in other["actor"].items()}
    loaded = requests.serve(LOAD, other)
    assert loaded["kind"] == LOAD and loaded["served"] == 2
    assert requests.updater is not None
    held = requests.updater.state()
    assert held["updates"] == 7
    for key, tensor in other["actor"].items():
        assert torch.equal(held["actor"][key], tensor), key


@pytest.mark.slow
# An updater that started a group of its own beside the module's would wait for CPUs the cluster does not have.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sharding, lora_rank", [("fsdp", 4), ("replicate", 0)])
def test_two_ray_workers_on_one_group_take_the_same_updates_as_one_process(
    sharding: str, lora_rank: int, redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path, group: Group
) -> None:
    # Mini-batches of 3 rows: 2 for one worker and 1 for the other, one row per micro-batch, so the
    # FSDP workers run unequal numbers of passes (the short one pads); a critic and a KL reference too.
    settings = tiny_settings(
        actor_lr=1e-3, critic_lr=1e-3, mini_batch_size=3, micro_batch_size=1, seed=3, lora_rank=lora_rank,
        sharding=sharding, max_updates=UPDATES,
    )
    torch.manual_seed(settings.seed)
    single = PPOUpdater.build(settings, tiny_model_dir)
    start = single.state()
    expected = _train(redis_client, tiny_model_dir, tmp_path / "one", single)
    trained = single.state()
    torch.manual_seed(settings.seed)
    workers = RayUpdater(settings, tiny_model_dir, num_workers=2, group=group.workers)
    try:
        got = _train(redis_client, tiny_model_dir, tmp_path / "ray", workers)
        _assert_same(trained, workers.state(), start)
        # One worker group served the start state and every update: rank 0 is the same process.
        assert workers.sharded == (sharding == "fsdp")
        # A resume: the state after the first update (AdamW's moments included) loaded into the
        # running workers, then the second batch again, must give the second update's weights.
        checkpoints = tmp_path / "one" / "checkpoints"
        after_first = Checkpointer(checkpoints).load_state(version_dir(checkpoints, 1))
        assert after_first is not None and after_first["actor_optimizer"]["state"]
        second = [to_sample(rollout) for rollout in _rollouts()[BATCH : 2 * BATCH]]
        for updater in (single, workers):
            updater.load_state(after_first)
            updater.update(second)
        _assert_same(single.state(), workers.state(), after_first)
        # One worker group served the start state, every update and the resume: rank 0 is one process, the one
        # that served the other sharding too.
        assert len(workers.worker_pids) == 1
        group.served_by |= workers.worker_pids
        assert len(group.served_by) == 1
    finally:
        workers.close()
    assert group.workers.thread.is_alive()  # an updater built on a group leaves it to its owner
    assert [s["version"] for s in got] == [s["version"] for s in expected] == [1, 2, 3]
    for one, two in zip(expected, got, strict=True):
        assert one["actor_steps"] == two["actor_steps"] == 2
        for key in ("reward_mean", "policy_loss", "value_loss", "clip_fraction", "ratio_max", "approx_kl", "kl"):
            assert two[key] == pytest.approx(one[key], rel=1e-3, abs=1e-5), key
