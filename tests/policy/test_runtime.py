"""``runtime.Policy``, what the servicer and the rollout workers call, on the loop's scripted engine: a request's
checks and sampling, the refusal of weights that failed to load, the rate gauges of rollouts that overlap, and
what a result depends on (``Info``, with the session's real retriever).

The same object on the real vLLM engine: tests/policy/test_async_rollouts.py (both loops give the same
trajectories; a weight update among running trajectories tags each with the weights that generated it); behind
its server: tests/policy/test_integration.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from ragr1.protocol.information import Passage
from ragr1.services.common.errors import InvalidArgument, Unavailable
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.policy.agent import Generation, GenerationRequest, LoopConfig, Sampling, Task, Trajectory
from ragr1.services.policy.backends import RetrieverSearch
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.rollouts import task_of
from ragr1.services.policy.runtime import Policy, RolloutLimits
from ragr1.services.policy.servicer import PolicyServicer
from ragr1.v1 import policy_pb2
from tests.policy.scripted import ScriptedEngine, ScriptedSearch
from tests.policy.test_streaming import TimedEngine, async_policy, task
from tests.policy.test_worker import LOCKSTEP_LOOP, SCRIPT, make_policy


def test_policy_rejects_bad_requests(tokenizer: Any, policy_model_dir: Path) -> None:
    policy = make_policy(tokenizer, policy_model_dir, ScriptedSearch())
    many = [Task(str(i), f"question {i}") for i in range(9)]
    with pytest.raises(InvalidArgument, match="9 items; the limit is max_batch=8"):
        policy.prompt_ids(many)
    with pytest.raises(InvalidArgument, match=r"tasks\[0\].question is 5000 characters; the limit is 4096"):
        policy.prompt_ids([Task("long", "x" * 5000)])
    with pytest.raises(InvalidArgument, match="temperature"):
        policy.sampling(-1, 0, 0, 0, [])
    short = Policy(
        ScriptedEngine(tokenizer, SCRIPT),
        tokenizer,
        ScriptedSearch(),
        LoopConfig(max_model_len=100),
        model_dir=policy_model_dir,
        default_sampling=Sampling(),
        limits=RolloutLimits(),
        schedule=LOCKSTEP_LOOP,
    )
    with pytest.raises(InvalidArgument, match="tokens; the model's maximum length is 100"):
        short.prompt_ids([Task("q", "Who wrote Hamlet?")])


def test_a_requests_zero_sampling_values_take_the_servers_defaults_and_a_bad_one_is_named(
    tokenizer: Any, policy_model_dir: Path
) -> None:
    """A zero top_p, max_tokens or seed is a field the request left out (proto3); a zero temperature is greedy."""
    policy = Policy(ScriptedEngine(tokenizer, SCRIPT), tokenizer, ScriptedSearch(), LoopConfig(max_model_len=100),
                    model_dir=policy_model_dir, default_sampling=Sampling(temperature=0.7, top_p=0.8,
                                                                          max_tokens_per_turn=50),
                    limits=RolloutLimits(), schedule=LOCKSTEP_LOOP)
    assert policy.sampling(0, 0, 0, 0, []) == Sampling(temperature=0, top_p=0.8, max_tokens_per_turn=50, seed=None)
    assert policy.sampling(1.0, 0.5, 20, 3, ["</x>"]) == Sampling(temperature=1.0, top_p=0.5, max_tokens_per_turn=20,
                                                                  seed=3, stop=("</x>",))
    for args, message in [((1.0, 1.5, 0, 0, []), "top_p must be in"), ((1.0, 0, 101, 0, []), "max_model_len=100"),
                          ((1.0, 0, 0, 0, ["</x>", ""]), "stop holds an empty string")]:
        with pytest.raises(InvalidArgument, match=message):
            policy.sampling(*args)


def test_weights_unknown_after_a_failed_load_refuse_an_async_rollout_as_a_lock_step_one(
    tokenizer: Any, policy_model_dir: Path
) -> None:
    """The fence's refusal reaches the caller as itself (UNAVAILABLE over gRPC), not as a group of failures."""
    policy = async_policy(TimedEngine(tokenizer), tokenizer, policy_model_dir)
    policy.gate.failed = "v1 from /nowhere: OSError: disk gone"
    with pytest.raises(Unavailable, match="disk gone"):
        asyncio.run(policy.rollout([task_of(task("f1", "Fast one?")), task_of(task("f2", "Fast two?"))], Sampling()))


QUESTIONS = [f"Who wrote book {i}?" for i in range(4)]


class SearchingEngine(ScriptedEngine):
    """Each question searches once, then answers; every generation takes 0.2 s, so calls overlap in time."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, {q: ["<search> author </search>", "<answer> someone </answer>"]
                                     for q in QUESTIONS})

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        await asyncio.sleep(0.2)
        return await super().generate(requests, sampling, stop)


class SlowSearch(ScriptedSearch):
    """Each search takes ``seconds``, as a retriever under load does."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        await asyncio.sleep(self.seconds)
        return await super().search(queries, groups)


def test_overlapping_rollouts_report_the_replicas_whole_rate_and_count_overlapping_waits_once(
    tokenizer: Any, policy_model_dir: Path
) -> None:
    """Four rollouts at once, each searching once (0.5 s): their searches overlap, so the trajectories' waits add
    up to more than the wall time, but the wait counted is at most the wall time; the tokens/s gauge is the four
    rollouts' rate, about four times any one call's tokens over its own time. (The counting itself:
    tests/policy/test_activity.py.)"""
    policy = async_policy(SearchingEngine(tokenizer), tokenizer, policy_model_dir)
    policy.loop.search.inner = SlowSearch(0.5)  # type: ignore[attr-defined]
    waited_before = REGISTRY.get_sample_value("ragr1_policy_retrieval_wait_seconds_total") or 0.0
    calls: list[tuple[int, float]] = []

    async def one(i: int) -> list[Trajectory]:
        start = time.perf_counter()
        trajectories = await policy.rollout([task_of(task(f"s{i}", QUESTIONS[i]))], Sampling())
        calls.append((sum(sum(t.loss_mask) for t in trajectories), time.perf_counter() - start))
        return trajectories

    async def scenario() -> list[list[Trajectory]]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    started = time.perf_counter()
    results = asyncio.run(scenario())
    wall = time.perf_counter() - started
    waits = [t.retrieval_seconds for trajectories in results for t in trajectories]
    assert all(t.retrieval_rounds == 1 for trajectories in results for t in trajectories)
    assert sum(waits) > wall  # the fault: the waits overlapped; summed, they would pass the wall time
    counted = (REGISTRY.get_sample_value("ragr1_policy_retrieval_wait_seconds_total") or 0.0) - waited_before
    assert 0.5 <= counted <= wall  # at least one search's sleep, at most the time it all took
    rate = REGISTRY.get_sample_value("ragr1_policy_generation_tokens_per_second")
    assert rate is not None
    assert rate > 2 * max(tokens / seconds for tokens, seconds in calls)  # four at once, not one call's rate


def test_the_policy_describes_what_its_results_depend_on(
    retriever_server: ServiceProcess, tokenizer: Any, policy_model_dir: Path, tmp_path: Path
) -> None:
    """``Policy.Info``: the served checkpoint and its hash, the loop's settings, the sampling defaults and seed,
    and the real retriever's index (corpus hash and size, encoder, index type); a retriever that does not
    answer, or a checkpoint gone from disk, is reported as such and the rest still answers."""

    async def info(address: str, served: Path | None = None) -> policy_pb2.PolicyInfoResponse:
        search = RetrieverSearch(address, top_k=2, timeout=10)
        policy = Policy(cast(Any, ScriptedEngine(tokenizer, {})), tokenizer, search, LoopConfig(top_k=2, max_turns=3),
                        model_dir=policy_model_dir, default_sampling=Sampling(temperature=0.7), limits=RolloutLimits(),
                        engine_seed=5, schedule=RolloutLoopSettings())
        if served is not None:  # as if an update had loaded it
            policy.gate.version, policy.gate.checkpoint_path = 1, str(served)
        try:
            return await PolicyServicer(policy, None).Info(policy_pb2.PolicyInfoRequest(), None)
        finally:
            await search.close()

    reply = asyncio.run(info(retriever_server.target))
    assert (reply.weight_version, reply.checkpoint_path) == (0, str(policy_model_dir))
    assert reply.checkpoint_sha256 == checkpoint_sha256(policy_model_dir) and not reply.checkpoint_error
    assert (reply.top_k, reply.max_turns, reply.max_queries_per_search, reply.query_separator) == (2, 3, 3, ",")
    assert reply.default_sampling.temperature == pytest.approx(0.7) and reply.engine_seed == 5
    assert reply.retriever.index_type == "flat" and reply.retriever.num_passages > 0 and not reply.retriever_error
    assert len(reply.retriever.corpus_sha256) == 64 and len(reply.retriever.manifest_sha256) == 64
    assert reply.code_commit

    # A checkpoint of other weights hashes otherwise; one gone from disk is reported, as is a retriever that is down.
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"other weights")
    assert asyncio.run(info(retriever_server.target, other)).checkpoint_sha256 == checkpoint_sha256(other)
    assert checkpoint_sha256(other) != reply.checkpoint_sha256
    gone = asyncio.run(info(f"127.0.0.1:{free_port()}", tmp_path / "gone"))
    assert (gone.weight_version, gone.checkpoint_path, gone.checkpoint_sha256) == (1, str(tmp_path / "gone"), "")
    assert "no *.safetensors" in gone.checkpoint_error
    assert not gone.retriever.encoder and "UNAVAILABLE" in gone.retriever_error
    assert gone.top_k == 2
