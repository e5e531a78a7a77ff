"""Rollout workers following the weight versions announced in Redis (``follower.WeightFollower``), on a real
Redis with the policy's real weight path (checkpoint check, digest, version fence) and an engine that only
records what it loads: a replica that starts finds the newest version before it takes a prompt, loads each
later one, and refuses one whose digest does not match what it reads, alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis
from safetensors.numpy import save_file

from ragr1.services.common import fleet
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling
from ragr1.services.policy.follower import WeightFollower
from ragr1.services.policy.runtime import Policy, RolloutLimits
from ragr1.services.policy.worker import RolloutWorker
from ragr1.v1 import common_pb2
from tests.policy.scripted import ScriptedSearch

CONFIG = {"architectures": ["TinyForCausalLM"], "model_type": "tiny", "hidden_size": 4, "vocab_size": 8}


def checkpoint(directory: Path, value: float) -> Path:
    """A checkpoint of the served architecture whose weights are ``value`` everywhere."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file({"w": np.full((4,), value, dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


class CharTokenizer:
    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, token_ids))

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self.encode(conversation[-1]["content"])


class LoadingEngine:
    """Records the checkpoints loaded into it; ``gate`` (when given) holds each load until it is set."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.loaded: list[Path] = []
        self.gate = gate

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        raise AssertionError("nothing generates in these tests")

    async def abort_all(self) -> None:
        pass

    async def reload_weights(self, checkpoint: Path) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.loaded.append(checkpoint)


class Replica:
    """A policy with its follower, as ``policy.server`` wires them, and its health switch recorded."""

    def __init__(self, client: redis.Redis, name: str, model_dir: Path, engine: LoadingEngine | None = None,
                 checkpoint_wait_seconds: float = 0.0) -> None:
        self.engine = engine or LoadingEngine()
        self.policy = Policy(self.engine, CharTokenizer(), ScriptedSearch(), LoopConfig(), model_dir=model_dir,
                             default_sampling=Sampling(), limits=RolloutLimits(max_batch=4))
        self.health: list[bool] = []
        self.follower = WeightFollower(self.policy, client, name, heartbeat_seconds=0.05,
                                       checkpoint_wait_seconds=checkpoint_wait_seconds, set_serving=self._serving)
        self.stop = asyncio.Event()
        self.task: asyncio.Future[None] | None = None

    async def _serving(self, serving: bool) -> None:
        self.health.append(serving)

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.follower.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)

    @property
    def version(self) -> int:
        return self.policy.gate.version


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


def reported(client: redis.Redis) -> dict[str, tuple[int, str, int]]:
    return {r.name: (r.version, r.state, r.target) for r in fleet.replicas(client)}


def announce(client: redis.Redis, version: int, path: Path, sha256: str | None = None) -> None:
    assert fleet.announce(client, version, str(path), sha256 or checkpoint_sha256(path))


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_replica_that_starts_loads_the_newest_version_before_it_takes_a_prompt(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    model = checkpoint(tmp_path / "model", 0.0)
    announce(redis_client, 1, checkpoint(tmp_path / "v1", 1.0))
    newest = checkpoint(tmp_path / "v2", 2.0)
    announce(redis_client, 2, newest)

    async def scenario() -> None:
        held = asyncio.Event()
        replica = Replica(redis_client, "policy-0", model, LoadingEngine(gate=held))
        replica.start()
        await until(lambda: reported(redis_client).get("policy-0") == (0, fleet.LOADING, 2), "never reported loading")
        assert not replica.follower.accepting.is_set()  # loading: no prompt yet
        held.set()
        await until(replica.follower.accepting.is_set, "never took prompts")
        assert replica.engine.loaded == [newest] and replica.version == 2  # only the newest, once
        assert replica.policy.gate.checkpoint_path == str(newest)
        assert (await replica.policy.served_checkpoint())[2] == checkpoint_sha256(newest)  # not read again
        await until(lambda: reported(redis_client).get("policy-0") == (2, fleet.SERVING, 0), "never reported v2")
        # Each later version as it is announced.
        third = checkpoint(tmp_path / "v3", 3.0)
        announce(redis_client, 3, third)
        await until(lambda: replica.version == 3, "v3 never loaded")
        assert replica.engine.loaded == [newest, third] and replica.health == [True]
        await replica.close()
        assert reported(redis_client) == {}  # a replica that stops leaves the fleet at once

    run(scenario)


def test_a_replica_with_nothing_announced_serves_its_starting_weights(redis_client: redis.Redis,
                                                                       tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", 0.0)

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model)
        replica.start()
        await until(replica.follower.accepting.is_set, "never took prompts")
        assert replica.version == 0 and replica.engine.loaded == []
        first = checkpoint(tmp_path / "v1", 1.0)
        announce(redis_client, 1, first)
        await until(lambda: replica.version == 1, "v1 never loaded")
        await replica.close()

    run(scenario)


def test_a_digest_mismatch_is_refused_by_that_replica_alone(redis_client: redis.Redis, tmp_path: Path) -> None:
    """policy-0 loaded v1; then the checkpoint's file changed under it (a damaged copy on the storage a
    replica reads), and policy-1, starting, reads other weights than the ones announced: it loads nothing,
    says why, takes no prompt and turns NOT_SERVING, while policy-0 goes on. A later good version brings it
    back."""
    model = checkpoint(tmp_path / "model", 0.0)
    v1 = checkpoint(tmp_path / "v1", 1.0)
    announce(redis_client, 1, v1)

    async def scenario() -> None:
        good = Replica(redis_client, "policy-0", model)
        good.start()
        await until(lambda: good.version == 1, "policy-0 never loaded v1")
        save_file({"w": np.full((4,), 9.0, dtype=np.float32)}, str(v1 / "model.safetensors"))
        damaged = Replica(redis_client, "policy-1", model)
        damaged.start()
        await until(lambda: reported(redis_client).get("policy-1", (0, "", 0))[1] == fleet.REFUSED,
                    "policy-1 never refused")
        assert damaged.engine.loaded == [] and damaged.version == 0  # nothing loaded
        assert damaged.health == [False] and not damaged.follower.accepting.is_set()
        (report,) = [r for r in fleet.replicas(redis_client) if r.name == "policy-1"]
        assert report.target == 1 and "hash to sha256" in report.reason and "not the" in report.reason
        assert good.follower.accepting.is_set() and good.health == [True] and good.version == 1
        assert reported(redis_client)["policy-0"] == (1, fleet.SERVING, 0)
        # Refused versions are not tried again; a later one that loads brings the replica back.
        v2 = checkpoint(tmp_path / "v2", 2.0)
        announce(redis_client, 2, v2)
        await until(lambda: damaged.version == 2 and good.version == 2, "v2 never loaded")
        await until(damaged.follower.accepting.is_set, "policy-1 never took prompts again")
        assert damaged.health == [False, True] and damaged.engine.loaded == [v2]
        await until(lambda: reported(redis_client)["policy-1"] == (2, fleet.SERVING, 0), "policy-1 never reported v2")
        await good.close()
        await damaged.close()

    run(scenario)


def test_a_checkpoint_that_is_not_there_yet_is_waited_for_then_refused(redis_client: redis.Redis,
                                                                      tmp_path: Path) -> None:
    """Shared storage may show another host's new directory late: the replica waits checkpoint_wait_seconds
    for it; one that never comes is refused with the reason."""
    model = checkpoint(tmp_path / "model", 0.0)
    weights = checkpoint(tmp_path / "staging", 1.0)
    digest = checkpoint_sha256(weights)
    late = tmp_path / "v1"
    announce(redis_client, 1, late, digest)

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model, checkpoint_wait_seconds=5.0)
        replica.start()
        await asyncio.sleep(0.3)
        assert replica.version == 0 and not replica.follower.accepting.is_set()
        weights.rename(late)
        await until(lambda: replica.version == 1, "the late checkpoint was never loaded")
        await replica.close()
        announce(redis_client, 2, tmp_path / "never", digest)
        impatient = Replica(redis_client, "policy-1", model, checkpoint_wait_seconds=0.2)
        impatient.start()
        await until(lambda: impatient.follower.state == fleet.REFUSED, "the missing checkpoint was never refused")
        assert "does not exist" in impatient.follower.reason and impatient.health == [False]
        await impatient.close()

    run(scenario)


def test_the_worker_takes_no_prompt_until_the_replica_accepts(redis_client: redis.Redis, tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", 0.0)
    prompts = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="w", consumer="w1")
    prompts.ensure_group()
    prompts.produce([common_pb2.PromptTask(id="p", question="q?")])
    rollouts = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer")

    async def scenario() -> None:
        policy = Policy(LoadingEngine(), CharTokenizer(), ScriptedSearch(), LoopConfig(), model_dir=model,
                        default_sampling=Sampling(), limits=RolloutLimits(max_batch=4))
        accepting, stop = asyncio.Event(), asyncio.Event()
        worker = RolloutWorker(policy, None, prompts, rollouts, Sampling(), batch=4, block_ms=10,  # type: ignore[arg-type]
                               reclaim_idle_ms=60_000, dead_letter_retrieval_errors=False, accepting=accepting)
        taken: list[int] = []

        async def step() -> int:
            taken.append(1)
            stop.set()
            return 0

        worker.step = step  # type: ignore[method-assign]
        running = asyncio.ensure_future(worker.run(stop))
        await asyncio.sleep(0.2)
        assert taken == [] and prompts.undelivered() == 1
        accepting.set()
        await asyncio.wait_for(running, 5)
        assert taken == [1]

    run(scenario)
