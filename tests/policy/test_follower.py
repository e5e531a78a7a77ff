"""Rollout workers following the weight versions announced in Redis (``follower.WeightFollower``), on a real
Redis with the policy's real weight path (checkpoint check, digest, version fence) and an engine that only
records what it loads (the issue allows a double for the follower's logic; tests/policy/test_integration.py and
make test-faults run the real engine): a replica that starts finds the newest version before it takes a prompt,
the starting weights included, loads each later one, waits for a checkpoint that is not complete, refuses one
that never is, alone, and tries it again."""

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
from ragr1.services.common.errors import Unavailable
from ragr1.services.common.hashing import checkpoint_files, checkpoint_sha256
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling
from ragr1.services.policy.follower import FollowerSettings, WeightFollower
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import Policy, RolloutLimits
from ragr1.services.policy.servicer import PolicyServicer
from ragr1.v1 import policy_pb2
from tests.common.waiting import holds_for_async, wait_async, wait_for_async
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
    """Records the checkpoints loaded into it; ``gate`` (when given) holds each load until it is set; the first
    ``failures`` loads raise, as an engine that failed part-way through replacing its weights does."""

    def __init__(self, gate: asyncio.Event | None = None, failures: int = 0) -> None:
        self.loaded: list[Path] = []
        self.gate = gate
        self.failures = failures

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        raise AssertionError("nothing generates in these tests")

    async def abort_all(self) -> None:
        pass

    async def reload_weights(self, checkpoint: Path) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the engine failed half-way through the load")
        self.loaded.append(checkpoint)


class Replica:
    """A policy with its follower, as ``policy.server`` wires them, and its health switch recorded."""

    def __init__(self, client: redis.Redis, name: str, model_dir: Path, engine: LoadingEngine | None = None,
                 checkpoint_wait_seconds: float = 0.0, retry_seconds: float = 60.0) -> None:
        self.engine = engine or LoadingEngine()
        self.policy = Policy(self.engine, CharTokenizer(), ScriptedSearch(), LoopConfig(), model_dir=model_dir,
                             default_sampling=Sampling(), limits=RolloutLimits(max_batch=4),
                             schedule=RolloutLoopSettings())
        self.health: list[bool] = []
        settings = FollowerSettings(heartbeat_seconds=0.05, checkpoint_wait_seconds=checkpoint_wait_seconds,
                                    refusal_retry_seconds=retry_seconds)
        self.follower = WeightFollower(self.policy, client, name, settings, set_serving=self._serving)
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
    """Within the scenario's minute, so that a failure names what never happened."""
    await wait_for_async(condition, what, seconds)


def reported(client: redis.Redis) -> dict[str, tuple[int, str, int]]:
    return {r.name: (r.version, r.state, r.target) for r in fleet.replicas(client)}


def reported_as(client: redis.Redis, name: str) -> tuple[int, str, int] | None:
    """``name``'s report, or None while it has none: between two heartbeats of a busy host a report can lapse
    (its time to live) and a waiting condition must read that as "not yet", not fail on it."""
    return reported(client).get(name)


def announce(client: redis.Redis, version: int, path: Path, sha256: str | None = None,
             files: dict[str, int] | None = None) -> None:
    """Announces ``path`` as the trainer does: its digest and its files (those of ``path`` unless given)."""
    listed = files if files is not None else checkpoint_files(path)
    assert fleet.announce(client, version, str(path), sha256 or checkpoint_sha256(path), listed)


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


def test_with_nothing_announced_a_replica_serves_calls_but_takes_no_prompt_until_a_version_is(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """Its own model is all it can serve (health SERVING for calls), but a rollout needs the version the
    trainer trains from: the trainer's starting weights, announced as v0, are its own model here (same digest),
    so nothing is loaded."""
    model = checkpoint(tmp_path / "model", 0.0)

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model)
        replica.start()
        await until(lambda: replica.health == [True], "never ready for calls")
        follower = replica.follower
        await holds_for_async(lambda: not follower.accepting.is_set() and follower.state == fleet.STARTING,
                              "with nothing announced, the replica takes no prompt", 0.3)
        announce(redis_client, 0, model)
        await until(replica.follower.accepting.is_set, "never took prompts")
        assert replica.version == 0 and replica.engine.loaded == []
        first = checkpoint(tmp_path / "v1", 1.0)
        announce(redis_client, 1, first)
        await until(lambda: replica.version == 1, "v1 never loaded")
        await replica.close()

    run(scenario)


def test_starting_weights_other_than_its_own_model_are_loaded_before_the_first_prompt(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """A trainer that starts from an SFT checkpoint announces it as v0; a replica (started, or restarted between
    SFT and the first update) whose own model is the base loads it, as v0, before it takes a prompt, and
    reports loading, not serving, meanwhile."""
    base = checkpoint(tmp_path / "base", 0.0)
    sft = checkpoint(tmp_path / "sft", 0.5)
    announce(redis_client, 0, sft)

    async def scenario() -> None:
        held = asyncio.Event()
        replica = Replica(redis_client, "policy-0", base, LoadingEngine(gate=held))
        replica.start()
        await until(lambda: reported(redis_client).get("policy-0") == (0, fleet.LOADING, 0), "never reported loading")
        assert not replica.follower.accepting.is_set() and replica.health == []  # not ready while it loads
        held.set()
        await until(replica.follower.accepting.is_set, "never took prompts")
        assert replica.engine.loaded == [sft] and replica.version == 0 and replica.health == [True]
        assert (await replica.policy.served_checkpoint())[2] == checkpoint_sha256(sft)
        await until(lambda: reported(redis_client).get("policy-0") == (0, fleet.SERVING, 0), "never reported serving")
        await replica.close()
        # Restarted (a new process: its own model again), it loads the SFT weights again before any prompt.
        again = Replica(redis_client, "policy-0", base)
        again.start()
        await until(again.follower.accepting.is_set, "the restarted replica never took prompts")
        assert again.engine.loaded == [sft]
        await again.close()

    run(scenario)


def test_a_digest_mismatch_is_refused_by_that_replica_alone_and_tried_again(redis_client: redis.Redis,
                                                                          tmp_path: Path) -> None:
    """policy-0 loaded v1; then the checkpoint's file changed under it (a damaged copy on the storage a
    replica reads), and policy-1, starting, reads other weights than the ones announced: it loads nothing,
    says why, takes no prompt and turns NOT_SERVING, while policy-0 goes on. It tries the version again: once
    the copy is repaired, it loads it."""
    model = checkpoint(tmp_path / "model", 0.0)
    v1 = checkpoint(tmp_path / "v1", 1.0)
    announce(redis_client, 1, v1)

    async def scenario() -> None:
        good = Replica(redis_client, "policy-0", model)
        good.start()
        await until(lambda: good.version == 1, "policy-0 never loaded v1")
        save_file({"w": np.full((4,), 9.0, dtype=np.float32)}, str(v1 / "model.safetensors"))
        damaged = Replica(redis_client, "policy-1", model, retry_seconds=0.5)
        damaged.start()
        await until(lambda: reported(redis_client).get("policy-1", (0, "", 0))[1] == fleet.REFUSED,
                    "policy-1 never refused")
        assert damaged.engine.loaded == [] and damaged.version == 0  # nothing loaded
        assert damaged.health == [False] and not damaged.follower.accepting.is_set()
        (report,) = [r for r in fleet.replicas(redis_client) if r.name == "policy-1"]
        assert report.target == 1 and "hash to sha256" in report.reason and "not the" in report.reason
        assert good.follower.accepting.is_set() and good.health == [True] and good.version == 1
        assert reported(redis_client)["policy-0"] == (1, fleet.SERVING, 0)
        save_file({"w": np.full((4,), 1.0, dtype=np.float32)}, str(v1 / "model.safetensors"))  # repaired
        await until(lambda: damaged.version == 1, "the refused version was never tried again")
        await until(damaged.follower.accepting.is_set, "policy-1 never took prompts")
        assert damaged.health == [False, True] and damaged.engine.loaded == [v1]
        await until(lambda: reported_as(redis_client, "policy-1") == (1, fleet.SERVING, 0),
                    "policy-1 never reported v1")
        await good.close()
        await damaged.close()

    run(scenario)


def test_a_checkpoint_whose_directory_appears_before_its_files_is_loaded_once_complete(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """Shared storage may show another host's new directory before its files, and a file before all its
    bytes: the announcement lists every file with its size, and the replica loads the version once they are
    all there, never refusing it meanwhile; one that never comes is refused with the reason."""
    model = checkpoint(tmp_path / "model", 0.0)
    weights = checkpoint(tmp_path / "staging", 1.0)
    files, digest = checkpoint_files(weights), checkpoint_sha256(weights)
    late = tmp_path / "v1"
    announce(redis_client, 1, late, digest, files)

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model, checkpoint_wait_seconds=20.0)
        replica.start()

        def waiting() -> bool:
            return (replica.version == 0 and replica.engine.loaded == [] and not replica.follower.accepting.is_set()
                    and replica.follower.state == fleet.LOADING and replica.health == [])

        await until(lambda: replica.follower.state == fleet.LOADING, "never waited for v1")
        await holds_for_async(waiting, "with no directory yet, the replica waits for v1 and refuses nothing", 0.3)
        late.mkdir()  # the directory, empty
        (late / "config.json").write_bytes((weights / "config.json").read_bytes())
        data = (weights / "model.safetensors").read_bytes()
        (late / "model.safetensors").write_bytes(data[: len(data) // 2])  # half copied
        await holds_for_async(waiting, "with v1 half copied, the replica waits for the rest and refuses nothing", 1.0)
        (late / "model.safetensors").write_bytes(data)
        await until(lambda: replica.version == 1, "the completed checkpoint was never loaded")
        # Readiness turns SERVING just after the load, not in the same step: wait for it, do not race it.
        await until(lambda: replica.health == [True], "readiness never turned SERVING after the load")
        assert replica.engine.loaded == [late]
        await replica.close()
        announce(redis_client, 2, tmp_path / "never", digest, files)
        impatient = Replica(redis_client, "policy-1", model, checkpoint_wait_seconds=0.2)
        impatient.start()
        await until(lambda: impatient.follower.state == fleet.REFUSED, "the missing checkpoint was never refused")
        assert "does not exist" in impatient.follower.reason and impatient.health == [False]
        await impatient.close()

    run(scenario)


def test_a_version_announced_while_a_checkpoint_is_waited_for_is_loaded_instead(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """A lagging replica waiting for v1 (pruned, or never complete) goes to v2 as soon as it is announced,
    without waiting out checkpoint_wait_seconds, and never loads v1."""
    model = checkpoint(tmp_path / "model", 0.0)
    staged = checkpoint(tmp_path / "staging", 1.0)
    announce(redis_client, 1, tmp_path / "v1", checkpoint_sha256(staged), checkpoint_files(staged))

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model, checkpoint_wait_seconds=60.0)
        replica.start()
        await until(lambda: replica.follower.state == fleet.LOADING, "never waited for v1")
        v2 = checkpoint(tmp_path / "v2", 2.0)
        announce(redis_client, 2, v2)
        await until(lambda: replica.version == 2, "v2 was never loaded", seconds=15)
        # The gate opens to prompts just after the load, not in the same step: wait for it, do not race it.
        await until(lambda: replica.follower.accepting.is_set(), "never took prompts again after loading v2")
        assert replica.engine.loaded == [v2]
        await replica.close()

    run(scenario)


def test_a_load_that_fails_in_the_engine_keeps_the_replica_out_until_a_load_succeeds(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """The engine may have replaced some weights and not others: nothing runs on them (a rollout is refused
    with UNAVAILABLE, not run on the old version's label), the replica refuses the version, and tries it
    again; the load that succeeds brings it back."""
    model = checkpoint(tmp_path / "model", 0.0)
    v1 = checkpoint(tmp_path / "v1", 1.0)
    announce(redis_client, 1, v1)

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model, LoadingEngine(failures=1), retry_seconds=0.5)
        replica.start()
        await until(lambda: replica.follower.state == fleet.REFUSED, "the failed load was never refused")
        assert "half-way" in replica.follower.reason and replica.health == [False]
        assert replica.policy.gate.failed and not replica.follower.accepting.is_set()
        try:
            async with replica.policy.gate.rollout():
                raise AssertionError("a rollout ran on weights the engine failed to load")
        except Unavailable as exc:
            assert "unknown" in str(exc)
        await until(lambda: replica.version == 1 and replica.follower.accepting.is_set(), "never tried again")
        assert replica.engine.loaded == [v1] and not replica.policy.gate.failed and replica.health == [False, True]
        async with replica.policy.gate.rollout() as version:
            assert version == 1
        await replica.close()

    run(scenario)


def test_a_replica_loading_a_new_version_starts_no_trajectory_on_the_superseded_one(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """v1 served; v2 announced while its checkpoint is not on the storage yet: for as long as it is waited for
    (and then its digest read and the load), the replica takes no prompt and a trajectory that would start waits,
    then starts on v2, not on the v1 that v2 supersedes."""
    model = checkpoint(tmp_path / "model", 0.0)
    announce(redis_client, 1, checkpoint(tmp_path / "v1", 1.0))
    staged = checkpoint(tmp_path / "staging", 2.0)
    late = tmp_path / "v2"

    async def scenario() -> None:
        replica = Replica(redis_client, "policy-0", model, checkpoint_wait_seconds=30.0)
        replica.start()
        await until(lambda: replica.version == 1 and replica.follower.accepting.is_set(), "v1 never served")
        announce(redis_client, 2, late, checkpoint_sha256(staged), checkpoint_files(staged))
        await until(lambda: replica.follower.state == fleet.LOADING, "v2 was never waited for")
        assert not replica.follower.accepting.is_set()  # no prompt taken meanwhile

        async def trajectory() -> int:
            async with replica.policy.gate.rollout() as version:
                return version

        started = asyncio.ensure_future(trajectory())
        await holds_for_async(lambda: not started.done() and replica.follower.state == fleet.LOADING,
                              "the trajectory waits while v2 is waited for", 0.5)
        late.mkdir()
        for name in ("config.json", "model.safetensors"):
            (late / name).write_bytes((staged / name).read_bytes())
        assert await wait_async(started, "the waiting trajectory never started", 20) == 2  # it started on v2
        await until(replica.follower.accepting.is_set, "never took prompts again after loading v2")
        await replica.close()

    run(scenario)


def test_an_update_weights_call_that_fails_in_the_engine_turns_the_replica_refused_until_a_load_succeeds(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """v1 served and announced; an UpdateWeights call (an operator, ``ragr1 eval --checkpoint``) loads another
    checkpoint and the engine fails half-way: the weights are unknown, so the follower reports it refused, turns
    NOT_SERVING and takes no prompt, as after a failed load of its own; it loads the announced v1 again after
    retry_seconds and serves."""
    model = checkpoint(tmp_path / "model", 0.0)
    v1 = checkpoint(tmp_path / "v1", 1.0)
    announce(redis_client, 1, v1)
    other = checkpoint(tmp_path / "other", 7.0)

    async def scenario() -> None:
        engine = LoadingEngine()
        replica = Replica(redis_client, "policy-0", model, engine, retry_seconds=0.5)
        replica.start()
        await until(lambda: replica.follower.accepting.is_set() and replica.version == 1, "v1 never served")
        engine.failures = 1
        servicer = PolicyServicer(replica.policy, None)
        try:
            await servicer.UpdateWeights(policy_pb2.UpdateWeightsRequest(version=2, checkpoint_path=str(other)), None)
            raise AssertionError("the load was meant to fail")
        except RuntimeError as exc:
            assert "half-way" in str(exc)  # the fault: the engine failed the call's load
        await until(lambda: replica.follower.state == fleet.REFUSED, "the failed call was never reflected")
        assert not replica.follower.accepting.is_set() and replica.health == [True, False]
        assert "failed in the engine" in replica.follower.reason
        await until(lambda: (reported_as(redis_client, "policy-0") or (0, "", 0))[1] == fleet.REFUSED,
                    "never reported refused")
        await until(lambda: replica.follower.state == fleet.SERVING and replica.follower.accepting.is_set(),
                    "the announced version was never loaded again")
        assert replica.engine.loaded == [v1, v1] and replica.version == 1 and replica.health == [True, False, True]
        await replica.close()

    run(scenario)
