"""Which loop runs a request's trajectories (``rollout_loop``), and for each of its values the rollout worker that
runs it: one registry, which the setting's check and the policy server's choice of worker both read."""

from __future__ import annotations

import dataclasses

from ragr1.services.common.config import Validated, check_choice, setting
from ragr1.services.policy.runtime import ASYNC, LOCKSTEP
from ragr1.services.policy.streaming import StreamingRolloutWorker
from ragr1.services.policy.worker import RolloutWorker

# The rollout worker of each loop: lock-step takes a batch and the next when it has finished; async keeps a
# prompt's group going on its own as soon as it fits.
WORKERS: dict[str, type[RolloutWorker]] = {LOCKSTEP: RolloutWorker, ASYNC: StreamingRolloutWorker}


@dataclasses.dataclass
class RolloutLoopSettings(Validated):
    """Which schedule runs a request's trajectories (the policy's config is one)."""

    # Lock-step keeps every trajectory of a batch on the turn of the slowest and the engine part-empty at the
    # end of each turn and batch; async keeps it fed. Lock-step stays as the baseline bench/rollout/loops.py
    # measures against (docs/services/policy.md).
    rollout_loop: str = setting(
        ASYNC, "lockstep: a batch's trajectories take each turn together (one engine call, one search call); "
        "async: each trajectory runs on its own, and a rollout worker keeps max_in_flight of them going"
    )

    def validate(self) -> None:
        super().validate()
        check_choice("rollout_loop", self.rollout_loop, tuple(WORKERS))
