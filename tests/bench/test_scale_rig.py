"""A small run of the scale rig (bench/fleet/scale_rig.py): two replicas, each a real rollout worker as the policy
server wires it beside a simulated engine (bench/fleet/simulated.py), with the session's real retriever, reward
server and Redis, and the trainer's consuming side (admission, groups) admitting prompts. While prompts wait for a
worker, no engine may be left idle, nor below its batch for want of trajectories its worker could have started: the
product's default keeps the engine's batch running besides the trajectories waiting on a search (up to twice the
batch). The same run with the worker capped under the batch shows that the check finds an engine kept
part-empty."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench.fleet.scale_rig import Fill, RunSpec, measure_fill
from bench.fleet.simulated import CONFIG, LatencyModel, Workload, write_model
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import RedisServer

BATCH = 6
# A worker refills its engine at each trajectory's end or search, after one prompt taken from Redis; under a
# quarter of the batch empty on average leaves room for those round trips on a busy machine, and is far below what
# a worker capped under its batch leaves (two thirds here, seven eighths at the old constant of 8 beside a batch
# of 64).
MOST_SHORT = 0.25
# An engine runs dry only if every trajectory of its batch is between two turns (parsing, tokenising) at once.
MOST_IDLE = 0.1


def spec(tmp_path: Path, redis_server: RedisServer, retriever: ServiceProcess, reward: ServiceProcess,
         model: Path, max_in_flight: int) -> RunSpec:
    return RunSpec(
        replicas=2, max_num_seqs=BATCH, max_in_flight=max_in_flight, replicas_per_process=2, samples=2,
        # Rollouts per update far beyond what the run makes: no weight update (and its fence) in the window.
        batch_size=400, max_staleness=1, ppo_seconds=0.1, weight_load_seconds=0.1, search_delay_seconds=0.0,
        # Turns of about a second: longer than a search on a busy machine, as on a GPU.
        latency=dataclasses.asdict(LatencyModel("test engine", base_ms=20.0, per_seq_ms=1.0)),
        workload=dataclasses.asdict(Workload(tokens_per_turn=40)), kv_cache_tokens=0, max_turns=3,
        max_tokens_per_turn=64, tokens_per_query=64, max_model_len=2048, redis_url=redis_server.url,
        router=retriever.target or "", reward=reward.target or "", model_dir=str(model),
        tokenizer_dir="", run_dir=str(tmp_path), seed=7,
    )


def fill(tmp_path: Path, redis_server: RedisServer, retriever: ServiceProcess, reward: ServiceProcess,
         tokenizer: Any, policy_model_dir: Path, max_in_flight: int) -> dict[str, Fill]:
    redis_server.client().flushall()
    model = write_model(tmp_path / "model", policy_model_dir / CONFIG, 0.0)
    run = spec(tmp_path, redis_server, retriever, reward, model, max_in_flight)
    return asyncio.run(measure_fill(run, tokenizer, seconds=5.0))


def test_no_simulated_engine_is_left_below_its_batch_while_prompts_wait(
    tmp_path: Path, redis_server: RedisServer, retriever_server: ServiceProcess, reward_server: ServiceProcess,
    tokenizer: Any, policy_model_dir: Path,
) -> None:
    fills = fill(tmp_path, redis_server, retriever_server, reward_server, tokenizer, policy_model_dir, 0)
    for name, f in fills.items():
        assert f.waited > 20, (name, f)  # prompts did wait: the check saw something
        assert f.short_share <= MOST_SHORT, (name, f)
        assert f.idle_share <= MOST_IDLE, (name, f)


def test_a_worker_capped_under_its_engines_batch_is_found(
    tmp_path: Path, redis_server: RedisServer, retriever_server: ServiceProcess, reward_server: ServiceProcess,
    tokenizer: Any, policy_model_dir: Path,
) -> None:
    fills = fill(tmp_path, redis_server, retriever_server, reward_server, tokenizer, policy_model_dir, 2)
    for name, f in fills.items():
        assert f.waited > 20, (name, f)
        assert f.short_share >= 1 - 2 / BATCH - 0.01, (name, f)  # two of six places held at most
        assert f.short_share > MOST_SHORT


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
