"""The PPO update's statistics: token-weighted means, minima and maxima over micro-batches, kept as tensors
on the device that computed them and read as numbers once per update (a read in the loop would make the
host wait for the device every micro-batch)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# reduce(tensor, op) combines a tensor across data-parallel workers in place; op is "sum", "min" or "max".
Reduce = Callable[[torch.Tensor, str], None]

# Keys of the update's statistics, by how they combine across micro-batches and workers.
_MEANS = (
    "policy_loss", "entropy", "kl_loss", "clip_fraction", "approx_kl", "importance_weight", "ratio_mean",
    "value_loss", "value_clip_fraction", "value_mean",
)
_MINS = ("ratio_min",)
_MAXES = ("ratio_max",)
# Stats that the loss functions divided by the mini-batch's token count rather than the micro-batch's.
_SHARED_DENOMINATOR = {"policy_loss", "entropy", "kl_loss", "value_loss"}


class StepStats:
    """Token-weighted means, minima and maxima over micro-batches, combinable across workers. They are
    accumulated on ``device`` (the statistics' own) and read only by ``result``."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.sums = torch.zeros(len(_MEANS), dtype=torch.float64, device=device)
        # Token counts come from the CPU batch: host numbers, no wait on the device.
        self.weights = torch.zeros(len(_MEANS), dtype=torch.float64, device=device)
        self.mins = torch.full((len(_MINS),), math.inf, dtype=torch.float64, device=device)
        self.maxes = torch.full((len(_MAXES),), -math.inf, dtype=torch.float64, device=device)

    def add(self, stats: dict[str, torch.Tensor], tokens: float, denominator: float) -> None:
        for i, key in enumerate(_MEANS):
            if key in stats:
                # Back to this micro-batch's own mean, weighted by its tokens.
                scale = denominator if key in _SHARED_DENOMINATOR else tokens
                self.sums[i] += stats[key].detach().to(torch.float64) * scale
                self.weights[i] += tokens
        for i, key in enumerate(_MINS):
            if key in stats:
                self.mins[i] = torch.minimum(self.mins[i], stats[key].detach().to(torch.float64))
        for i, key in enumerate(_MAXES):
            if key in stats:
                self.maxes[i] = torch.maximum(self.maxes[i], stats[key].detach().to(torch.float64))

    def reduce(self, reduce: Reduce) -> None:
        reduce(self.sums, "sum")
        reduce(self.weights, "sum")
        reduce(self.mins, "min")
        reduce(self.maxes, "max")

    def result(self) -> dict[str, float]:
        """The statistics as numbers: one copy from the device."""
        sums, weights, mins, maxes = (
            t.tolist() for t in torch.cat([self.sums, self.weights, self.mins, self.maxes]).cpu().split(
                [len(_MEANS), len(_MEANS), len(_MINS), len(_MAXES)]
            )
        )
        out = {k: sums[i] / weights[i] for i, k in enumerate(_MEANS) if weights[i] > 0}
        out.update({k: mins[i] for i, k in enumerate(_MINS) if math.isfinite(mins[i])})
        out.update({k: maxes[i] for i, k in enumerate(_MAXES) if math.isfinite(maxes[i])})
        return out


def numbers(stats: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """``stats`` as numbers, its tensors read from the device in one copy."""
    tensors = {k: v for k, v in stats.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    if tensors:
        values = torch.stack([t.detach().to(torch.float64) for t in tensors.values()]).tolist()
        out.update(zip(tensors, values, strict=True))
    return out
