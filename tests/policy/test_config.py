from __future__ import annotations

import dataclasses

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
    assert config.weight_update_policy() is InFlight.FINISH


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
        ({"on_weight_update": "later"}, "on_weight_update must be 'finish' or 'abort'"),
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
