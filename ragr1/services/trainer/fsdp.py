"""FSDP (PyTorch's ``fully_shard``, FSDP2) for the Ray workers, as verl shards RAG-R1's actor and critic.

Each decoder layer is one FSDP unit and the network's root module (``PolicyModel``, ``ValueModel``) is
the last: every computation, the reference pass included, goes through the root's ``forward``, so the
root's parameters (embeddings, final norm, the tied head, the value head) are gathered for it and their
gradients reduce-scattered after it. Each worker then holds 1/N of the weights, gradients and AdamW
state. FSDP averages the workers' gradients; every worker's loss is already divided by the whole
mini-batch's token count, so the one-process gradient is their sum, and ``PPOUpdater.step`` multiplies a
sharded worker's loss by the number of workers. (A divide factor of 1 would say the same, but its
pre-multiplied sum is an operation gloo does not have.)

Sharded parameters are ``DTensor``s. Whatever leaves the trainer (trainable state, optimiser state,
the published weights) is gathered into plain CPU tensors with ``full``, a collective every worker joins;
what comes in is scattered with ``distribute_like``. With LoRA, the actor and the critic shard their
own copies of the frozen base (one process shares one copy between them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ragr1.services.trainer.stepstats import Reduce


def shard(root: nn.Module, layers: Iterable[nn.Module]) -> None:
    """``fully_shard`` each of ``layers``, then ``root`` (which takes the parameters left over)."""
    from torch.distributed.fsdp import fully_shard

    for module in [*layers, root]:
        fully_shard(module)


def is_sharded(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DTensor)


def full(value: Any) -> Any:
    """``value`` with every DTensor in it (nested in dicts, lists, tuples) gathered whole: a collective."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full(v) for v in value)
    return value


def distribute_like(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A whole ``tensor`` as ``like`` holds it: sharded the same way when ``like`` is a DTensor."""
    if isinstance(like, DTensor):
        return distribute_tensor(tensor.to(like.device, like.dtype), like.device_mesh, like.placements)
    return tensor


def whole(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a value that may be a DTensor, such as ``clip_grad_norm_``'s total norm; it stays
    on its device (reading it as a number would make the host wait for the device)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict`` from whole tensors (a CPU checkpoint), sharded as the parameters are.

    AdamW's per-parameter moments have the parameter's shape; a sharded parameter needs its moments as
    DTensors of the same layout (``load_state_dict`` would leave them plain and the step would fail)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(isinstance(p, DTensor) for p in params):
        optimizer.load_state_dict(state)
        return
    per_param: dict[int, dict[str, Any]] = {}
    for index, values in state["state"].items():
        param = params[int(index)]
        per_param[index] = {
            key: distribute_like(v, param) if torch.is_tensor(v) and v.shape == param.shape else v
            for key, v in values.items()
        }
    optimizer.load_state_dict({**state, "state": per_param})


def process_group_reduce(device: torch.device) -> Reduce:
    """``Reduce`` over the default ``torch.distributed`` process group, which must be initialised."""
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

    def reduce(tensor: torch.Tensor, op: str) -> None:
        # NCCL reduces only GPU tensors (the identity where the tensor is there already).
        moved = tensor.to(device)
        dist.all_reduce(moved, op=ops[op])
        tensor.copy_(moved)

    return reduce
