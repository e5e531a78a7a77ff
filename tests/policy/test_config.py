from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ragr1.protocol.prompts import Mode
from ragr1.services.common import ports
from ragr1.services.common.config import load
from ragr1.services.policy.agent import LoopConfig
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.policy.engine import EngineSettings
from ragr1.services.policy.runtime import RolloutLimits
from ragr1.services.policy.weights import InFlight


def test_defaults_come_from_the_loop_engine_limits_and_ports() -> None:
    config = PolicyConfig()
    assert config.port == ports.POLICY
    assert config.loop_config() == LoopConfig()
    assert config.engine_settings(Path("model")) == EngineSettings(Path("model"))
    assert RolloutLimits(config.max_batch, config.max_question_chars) == RolloutLimits()
    assert config.in_flight_policy() is InFlight.FINISH


def test_environment_and_overrides_reach_the_loop() -> None:
    config = load(
        PolicyConfig,
        env={"RAGR1_MAX_TURNS": "3", "RAGR1_MODE": "single"},
        overrides={"query_separator": ";"},
    )
    loop = config.loop_config()
    assert (loop.max_turns, loop.mode, loop.query_separator) == (3, Mode.SINGLE, ";")


def test_default_context_holds_max_turns_searches_of_three_full_queries() -> None:
    config = PolicyConfig()  # checks itself: the default context holds the default searches
    loop = config.loop_config()
    assert (loop.max_turns, loop.max_queries_per_search, loop.top_k) == (4, 3, 3)  # RAG-R1's
    assert loop.context_needed(config.max_tokens_per_turn) <= loop.max_model_len


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
    ],
)
def test_bad_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PolicyConfig(), **change)  # type: ignore[arg-type]
