"""Settings of the reward server: the common server settings plus the scorer's own (``RewardSettings``,
each defined once in ``scoring.py`` with its default and help)."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.reward.scoring import RewardSettings


@dataclasses.dataclass
class RewardConfig(RewardSettings, ServerConfig):
    port: int = setting(ports.REWARD, "gRPC port; 0 picks a free one")
