"""``ragr1 train sft`` (format learning) and ``ragr1 train ppo`` (the loop on the Redis streams)."""

from __future__ import annotations

from typing import Any

from ragr1.model_paths import check_model
from ragr1.services.common.commands import command, service
from ragr1.services.trainer.config import PPOConfig, SFTConfig


def _run_sft(config: SFTConfig) -> int:
    check_model(config)
    from ragr1.services.trainer.sft import SFTTrainer

    path = SFTTrainer(config).train()
    print(f"SFT checkpoint: {path}", flush=True)
    return 0


def register(commands: Any, serve: Any) -> None:
    train = commands.add_parser("train", help="train the policy: SFT (format learning), then PPO")
    stages = train.add_subparsers(dest="stage", required=True, metavar="STAGE")
    command(stages, "sft", SFTConfig, _run_sft, help="format-learning SFT on think-then-search trajectories")
    service(stages, "ppo", PPOConfig, "ragr1.services.trainer.server", check=check_model,
            help="PPO on rollouts from the Redis stream, weights back to the policy")
