"""``ragr1 serve reward``."""

from __future__ import annotations

from typing import Any

from ragr1.services.common.commands import service
from ragr1.services.reward.config import RewardConfig


def register(commands: Any, serve: Any) -> None:
    service(serve, "reward", RewardConfig, "ragr1.services.reward.server",
            help="score trajectories: EM/F1, format and retrieval-process rewards")
