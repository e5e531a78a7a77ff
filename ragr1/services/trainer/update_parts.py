"""The PPO update's working parts (``updater.PPOUpdater``): the batch it prepared and each model it optimises."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from ragr1.services.trainer import ppo_math
from ragr1.services.trainer.model import Batch


@dataclasses.dataclass
class Prepared:
    """The whole batch on the CPU (row bookkeeping); everything else on the models' device."""

    batch: Batch
    old_logprobs: torch.Tensor
    old_values: torch.Tensor | None
    # Only when the KL is a loss term (GRPO's default); PPO's default has it in the rewards already.
    ref_logprobs: torch.Tensor | None
    behaviour_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor | None
    scores: torch.Tensor
    stats: dict[str, torch.Tensor | float]

    def tokens(self, rows: Sequence[int]) -> float:
        return float(self.batch.mask[list(rows)].sum().clamp(min=1))


@dataclasses.dataclass
class Optimised:
    """One trained model with its optimiser and schedule."""

    name: str
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    lr: float
    warmup_updates: int
    max_grad_norm: float
    # One per optimiser step, on the device: read once per update.
    grad_norms: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def set_learning_rate(self, update: int) -> float:
        lr = self.lr * ppo_math.warmup_factor(update, self.warmup_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr
