"""Trained weights held in the compute dtype, with float32 master copies that the optimiser steps: verl's FSDP
mixed precision (``param_dtype`` bfloat16; gradients reduced and accumulated, and the optimiser's state kept,
in float32), for a network that is not sharded.

Under autocast a network's weights are float32 and every forward casts each one to bfloat16 again: the
no-gradient passes, each micro-batch's forward, the recomputation of every checkpointed layer, with the
backward casting each weight's gradient back. Four operators a weight a pass, the most common operators of a
PPO update (a launch of a few microseconds each on a GPU, where a step of small operators waits on the host).

Here the network's trained weights are bfloat16, views into one flat buffer, and stay so between steps;
their gradients are views into a second one. After each backward the bfloat16 gradients are added into the
float32 gradients of the masters (one flat buffer too) and cleared: two operators a micro-batch, whatever the
number of weights. The optimiser steps the masters; after each step they are rounded into the network's
weights in one copy. The matrix products compute what autocast computed (the same bfloat16 weights); the
embeddings, the norms' weights and the residual stream are bfloat16 too, as under FSDP's ``param_dtype``.

Memory, per trained weight: 2 bytes of weight, 4 of master and 8 of AdamW's moments held; 2 + 4 bytes of
gradients only during the network's step (their buffers' storage is released after it and taken back at the
next, as FSDP2 does with its unsharded parameters): a PPO update's actor and critic, which step in turn,
peak where float32 weights with persistent float32 gradients did (16 bytes each, and 4 for the reference,
which is 2 here).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class MasterWeights:
    """``params`` (a network's trained weights, float32) converted to ``dtype`` views of one buffer, each with
    its float32 master (``masters``, what the optimiser takes)."""

    def __init__(self, params: Sequence[nn.Parameter], dtype: torch.dtype = torch.bfloat16) -> None:
        if not params:
            raise ValueError("master weights need at least one trained weight")
        devices = {p.device for p in params}
        if len(devices) != 1 or any(p.dtype != torch.float32 for p in params):
            raise ValueError("master weights are made from float32 weights on one device")
        (device,) = devices
        numel = sum(p.numel() for p in params)
        self.weights = torch.empty(numel, dtype=dtype, device=device)
        self.grads = torch.zeros(numel, dtype=dtype, device=device)
        self.master = torch.empty(numel, dtype=torch.float32, device=device)
        self.master_grads = torch.zeros(numel, dtype=torch.float32, device=device)
        with torch.no_grad():
            offset = 0
            for p in params:
                self.master[offset : offset + p.numel()].copy_(p.reshape(-1))
                offset += p.numel()
            self.weights.copy_(self.master)
        self.masters = [nn.Parameter(view) for view in self._views(self.master, params)]
        self._released = False
        self._bind(list(params))

    @staticmethod
    def _views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        views, offset = [], 0
        for t in like:
            views.append(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()
        return views

    def _bind(self, params: list[nn.Parameter]) -> None:
        """The network's weights and gradients as views of the flat buffers, the masters' gradients too."""
        self.params = params
        for p, weight, grad in zip(params, self._views(self.weights, params), self._views(self.grads, params),
                                   strict=True):
            p.data = weight
            p.grad = grad
        for master, grad in zip(self.masters, self._views(self.master_grads, params), strict=True):
            master.grad = grad
        self._point()

    def _point(self) -> None:
        # Autograd adds each backward's gradient into an existing ``.grad`` in place: the views stay views as long
        # as nothing replaces them, which ``accumulate`` checks (host pointers: no wait on the device).
        self._grad_pointers = [p.grad.data_ptr() for p in self.params]  # type: ignore[union-attr]

    def __deepcopy__(self, memo: dict[int, Any]) -> MasterWeights:
        """A copy whose network weights (copied along, through ``memo``) are views of its own buffers again:
        a copied ``nn.Parameter`` owns a fresh copy of its data and has no gradient."""
        new = MasterWeights.__new__(MasterWeights)
        memo[id(self)] = new
        new.weights, new.master = self.weights.clone(), self.master.clone()
        for name in ("grads", "master_grads"):
            flat = getattr(self, name)
            setattr(new, name, torch.zeros_like(flat) if self._released else flat.clone())
        new.masters = [nn.Parameter(view) for view in self._views(new.master, self.masters)]
        new._released = False
        new._bind([copy.deepcopy(p, memo) for p in self.params])
        return new

    @property
    def nbytes(self) -> int:
        return self.weights.numel() * self.weights.element_size()

    def master_of(self) -> dict[int, nn.Parameter]:
        """Each network weight's master, by the weight's ``id``."""
        return {id(p): m for p, m in zip(self.params, self.masters, strict=True)}

    def begin(self) -> None:
        """Before a step's first backward: the gradients' buffers back (when released), zeroed."""
        if not self._released:
            return
        for flat in (self.grads, self.master_grads):
            flat.untyped_storage().resize_(flat.numel() * flat.element_size())
            flat.zero_()
        self._released = False
        self._point()

    def accumulate(self) -> None:
        """After a backward: its gradients into the masters' (float32), the network's cleared for the next."""
        if self._released:
            raise RuntimeError("gradients outside a step: call begin() before the backward")
        if [p.grad.data_ptr() if p.grad is not None else 0 for p in self.params] != self._grad_pointers:
            raise RuntimeError("a trained weight's gradient is no longer a view of the gradient buffer (set to None?)")
        self.master_grads.add_(self.grads)
        self.grads.zero_()

    def clip(self, others: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_``'s arithmetic over the masters' gradients and those of ``others`` (weights
        kept float32, such as a value head): the total norm, returned as a tensor, and every gradient scaled by
        ``min(1, max_norm / (norm + 1e-6))``; on the one buffer instead of one norm and one product a weight."""
        grads = [p.grad for p in others if p.grad is not None]
        norms = [torch.linalg.vector_norm(self.master_grads), *(torch.linalg.vector_norm(g) for g in grads)]
        total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for flat in (self.master_grads, *grads):
            flat.mul_(scale)
        return total

    def publish(self) -> None:
        """After an optimiser step, or the masters loaded: the network computes with them, rounded; the
        gradients' buffers are released until the next ``begin``."""
        with torch.no_grad():
            self.weights.copy_(self.master)
        for flat in (self.grads, self.master_grads):
            flat.untyped_storage().resize_(0)
        self._released = True


class Mastered:
    """A network's side of ``MasterWeights`` (``PolicyModel``, ``ValueModel``): what its optimiser steps and the
    calls around a step, each a plain step on the trained weights when no masters are held."""

    masters: MasterWeights | None

    def trained_parameters(self) -> list[nn.Parameter]:
        """The weights the network trains."""
        raise NotImplementedError

    def float32_trained(self) -> list[nn.Parameter]:
        """Trained weights left out of the masters, stepped as they are (a value head)."""
        return []

    def optimizer_parameters(self) -> list[nn.Parameter]:
        """What the optimiser steps: the float32 masters when they are held, else the trained weights."""
        if self.masters is None:
            return self.trained_parameters()
        return [*self.masters.masters, *self.float32_trained()]

    def begin_gradients(self) -> None:
        """Before a step's first backward."""
        if self.masters is not None:
            self.masters.begin()

    def accumulate_gradients(self) -> None:
        """After each backward."""
        if self.masters is not None:
            self.masters.accumulate()

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """The optimiser's gradients clipped to ``max_norm`` by their global norm, which it returns."""
        if self.masters is not None:
            return self.masters.clip(self.float32_trained(), max_norm)
        return torch.nn.utils.clip_grad_norm_(self.trained_parameters(), max_norm)

    def publish_weights(self) -> None:
        """After each optimiser step: the network computes with the masters, rounded."""
        if self.masters is not None:
            self.masters.publish()
