"""The stack's ``--reward`` reaches the reward service: started with the flags ``wiring.reward_spec`` writes,
a partly right answer is paid its F1 under ``f1`` and nothing under ``em``; ``parallel-search`` pays ParallelSearch's
reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.reward.client import RewardClient
from ragr1.services.reward.parallel_search import ParallelSearchSettings
from ragr1.shipped import BRIDGE
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig
from ragr1.v1 import reward_pb2

RESPONSE = (
    "<think>Let me search.</think><search>Hamlet author</search>"
    "<information>Doc 1(Title: Hamlet) a tragedy by William Shakespeare</information>"
    "<think>Found it.</think><answer>Shakespeare</answer>"
)


@pytest.mark.parametrize("reward", ["em", "f1"])
def test_the_reward_service_pays_what_the_stack_asked_for(tmp_path: Path, reward: str) -> None:
    config = StackConfig(reward=reward, base_port=free_port() // 100 * 100)  # ports away from the defaults
    spec = wiring.reward_spec(config, wiring.Ports.of(config))
    with ServiceProcess.ragr1("reward", spec.args, spec.target, tmp_path / "reward.log", start_timeout=60), \
            RewardClient(spec.target) as client:
        (scored,) = client.score([reward_pb2.ScoreItem(response=RESPONSE, golden_answers=["William Shakespeare"])])
    assert scored.exact_match == 0.0 and scored.f1 == pytest.approx(2 / 3)
    assert scored.total == pytest.approx(scored.f1 if reward == "f1" else 0.0)


def test_parallel_search_reaches_the_reward_service_with_its_own_constants(tmp_path: Path) -> None:
    """``--reward parallel-search``: ParallelSearch's scheme with its training script's constants. A bridge
    question answered right after one search: one search short of its best (no count reward), not decomposed
    (its decomposition reward): 1 + comp_score. The stack's default stays exact match."""
    assert StackConfig().reward == "em"
    config = StackConfig(reward="parallel-search", base_port=free_port() // 100 * 100)
    spec = wiring.reward_spec(config, wiring.Ports.of(config))
    item = reward_pb2.ScoreItem(response=RESPONSE, golden_answers=["Shakespeare"], question_type=BRIDGE)
    with ServiceProcess.ragr1("reward", spec.args, spec.target, tmp_path / "reward.log", start_timeout=60), \
            RewardClient(spec.target) as client:
        (scored,) = client.score([item])
    assert scored.exact_match == 1.0
    assert (scored.decomposition, scored.search_count) == pytest.approx((ParallelSearchSettings().comp_score, 0.0))
    assert scored.total == pytest.approx(1.0 + ParallelSearchSettings().comp_score)


def test_an_unknown_reward_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="reward must be one of em, f1, parallel-search, got 'bleu'"):
        StackConfig(reward="bleu")
