"""The local stack's trainer shares the cores with the policy's vLLM engine: ``wiring.trainer_spec`` gives
it half of them (bench/trainer/colocation.py measured why), the trainer's CLI reads the flag, and the
training process runs with that many torch threads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragr1.cli import build_parser
from ragr1.services.common.config import from_args
from ragr1.services.trainer.config import PPOConfig, PPOSettings, SFTConfig
from ragr1.services.trainer.model import init_torch
from ragr1.services.trainer.sft import SFTTrainer
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (16, 8)])
def test_the_trainer_gets_half_the_cores_by_default(cores: int, threads: int) -> None:
    assert wiring.trainer_threads(StackConfig(), cores) == threads


def test_a_configured_thread_count_wins_and_a_negative_one_is_refused() -> None:
    assert wiring.trainer_threads(StackConfig(trainer_threads=3), 2) == 3
    with pytest.raises(ValueError, match="trainer_threads must be at least 0, got -1"):
        StackConfig(trainer_threads=-1)


def test_the_trainer_cli_reads_the_stack_s_thread_count(tmp_path: Path) -> None:
    config = StackConfig(trainer_threads=1)
    spec = wiring.trainer_spec(config, wiring.Ports.of(config), tmp_path / "model", tmp_path / "out")
    args = build_parser().parse_args(spec.args)
    assert from_args(PPOConfig, args).threads == 1


def test_training_runs_with_the_configured_threads() -> None:
    before = torch.get_num_threads()
    try:
        init_torch(PPOSettings(threads=1))
        assert torch.get_num_threads() == 1
        init_torch(PPOSettings(threads=0))  # 0 leaves torch's own count alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be at least 0, got -2"):
        PPOSettings(threads=-2)
    with pytest.raises(ValueError, match="threads must be at least 0, got -1"):
        SFTTrainer(SFTConfig(threads=-1))  # refused before a model is loaded
