"""Trained weights held in bfloat16 with float32 masters (``precision``): the network computes with the masters
rounded, gradients accumulate into the masters' in float32, steps too small for bfloat16 still move the masters,
and what leaves the trainer (its state, the policy it saves) is the masters."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ragr1.services.trainer.loop import to_sample
from ragr1.services.trainer.model import PolicyModel
from ragr1.services.trainer.precision import MasterWeights
from ragr1.services.trainer.updater import PPOUpdater
from tests.trainer.rollouts import make_rollout, tiny_settings


def test_master_weights_accumulate_in_float32_and_publish_the_masters_rounded() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    original = [p.detach().clone() for p in layer.parameters()]
    masters = MasterWeights(list(layer.parameters()))
    assert all(p.dtype == torch.bfloat16 for p in layer.parameters())
    assert all(torch.equal(m, o) for m, o in zip(masters.masters, original, strict=True))
    assert all(torch.equal(p, o.to(torch.bfloat16)) for p, o in zip(layer.parameters(), original, strict=True))
    x = torch.randn(4, 3, dtype=torch.bfloat16)
    masters.begin()
    expected = []
    for _ in range(2):  # two micro-batches
        layer(x).sum().backward()
        expected.append([p.grad.float().clone() for p in layer.parameters()])  # type: ignore[union-attr]
        masters.accumulate()
        assert all(float(p.grad.abs().max()) == 0 for p in layer.parameters())  # type: ignore[union-attr]
    for m, (a, b) in zip(masters.masters, zip(*expected, strict=True), strict=True):
        assert m.grad is not None and m.grad.dtype == torch.float32
        assert torch.equal(m.grad, a + b)  # bfloat16 values add exactly in float32 here: 2 terms
    with torch.no_grad():
        masters.masters[0].add_(1e-4)  # below bfloat16's resolution at these weights' size
    masters.publish()
    weight = next(iter(layer.parameters()))
    assert torch.equal(weight, masters.masters[0].to(torch.bfloat16))
    assert not torch.equal(masters.masters[0], original[0])  # the master kept what the weight could not
    # Between steps the gradients take no memory; the next step has them back, zeroed.
    assert masters.grads.untyped_storage().nbytes() == masters.master_grads.untyped_storage().nbytes() == 0
    with pytest.raises(RuntimeError, match="outside a step"):
        masters.accumulate()
    masters.begin()
    assert masters.master_grads.untyped_storage().nbytes() == 4 * masters.master_grads.numel()
    layer(x).sum().backward()
    masters.accumulate()
    assert all(torch.equal(m.grad, e) for m, e in zip(masters.masters, expected[0], strict=True))  # type: ignore[arg-type]


def test_clipping_the_masters_gradients_is_clip_grad_norm() -> None:
    torch.manual_seed(0)
    layer, head = nn.Linear(4, 3), nn.Linear(3, 1)
    twin, twin_head = copy.deepcopy(layer), copy.deepcopy(head)
    masters = MasterWeights(list(layer.parameters()))
    masters.begin()
    head(layer(torch.randn(5, 4, dtype=torch.bfloat16)).float()).sum().backward()
    masters.accumulate()
    # The same gradients on float32 weights: clip_grad_norm_ over them gives the norm and the scaled gradients.
    for master, weight in zip(masters.masters, twin.parameters(), strict=True):
        weight.grad = master.grad.clone()  # type: ignore[union-attr]
    for p, q in zip(head.parameters(), twin_head.parameters(), strict=True):
        q.grad = p.grad.clone()  # type: ignore[union-attr]
    want = torch.nn.utils.clip_grad_norm_([*twin.parameters(), *twin_head.parameters()], 0.5)
    got = masters.clip(list(head.parameters()), 0.5)
    assert float(want) > 0.5  # the clip acts
    # Norms of the same values summed in another order: float32 rounding of the sum of squares, 8 u of it.
    assert abs(float(got) - float(want)) <= 8 * 2**-24 * float(want)
    for p, q in zip([*masters.masters, *head.parameters()], [*twin.parameters(), *twin_head.parameters()], strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=8 * 2**-24, atol=0)  # type: ignore[arg-type]


def test_a_copy_of_master_weights_computes_with_its_own_buffers() -> None:
    layer = nn.Linear(3, 2)
    held = {"layer": layer, "masters": MasterWeights(list(layer.parameters()))}
    twin = copy.deepcopy(held)
    with torch.no_grad():
        twin["masters"].masters[0].fill_(1.0)
    twin["masters"].publish()
    assert float(twin["layer"].weight.detach().min()) == 1.0 and float(layer.weight.detach().min()) != 1.0
    twin["masters"].begin()
    twin["layer"](torch.ones(1, 3, dtype=torch.bfloat16)).sum().backward()
    twin["masters"].accumulate()  # the copy's gradients are views of the copy's buffer
    assert float(twin["masters"].master_grads.abs().sum()) > 0 and float(held["masters"].master_grads.abs().sum()) == 0
    layer.weight.grad = None
    with pytest.raises(RuntimeError, match="no longer a view"):
        held["masters"].accumulate()


def test_a_bf16_update_steps_float32_masters_and_saves_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    settings = tiny_settings(bf16=True, actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.05, mini_batch_size=2)
    updater = PPOUpdater.build(settings, tiny_model_dir)
    actor, critic = updater.actor, updater.critic
    assert actor.masters is not None and critic is not None and critic.masters is not None
    assert {p.dtype for p in actor.actor_parameters()} == {torch.bfloat16}
    assert actor.reference is not None and {p.dtype for p in actor.reference.parameters()} == {torch.bfloat16}
    assert critic.value_head.weight.dtype == torch.float32
    start = actor.trainable_state()
    samples = [to_sample(make_rollout(f"r{i}", score=float(i % 2), seed=i)) for i in range(4)]
    for sample in samples:
        sample.behaviour_logprobs = None
    first = updater.prepare(samples)
    # The reference is the actor's weights in the same dtype, computed the same way: no KL before a step.
    assert float(first.stats["kl"]) == 0.0
    stats = updater.update(samples)
    assert stats["actor_steps"] == 2 and stats["policy_loss"] == stats["policy_loss"]  # finite
    state = actor.trainable_state()
    assert all(v.dtype == torch.float32 for v in state.values())
    moved = max(float((state[k] - start[k]).abs().max()) for k in state)
    assert moved > 0
    # The network computes with its masters rounded.
    for name, weight in actor.base().named_parameters():
        assert torch.equal(weight, state[f"lm.{name}"].to(weight.device, torch.bfloat16)), name
    actor.save_policy(tmp_path / "policy")
    saved = load_file(str(tmp_path / "policy" / "model.safetensors"))
    assert json.loads((tmp_path / "policy" / "config.json").read_text())["dtype"] == "float32"
    for key, value in saved.items():
        assert value.dtype == torch.float32 and torch.equal(value, state[f"lm.{key}"]), key
    # A resumed updater holds the same masters.
    other = PPOUpdater.build(settings, tiny_model_dir)
    other.load_state(updater.state())
    for name, weight in other.actor.base().named_parameters():
        assert torch.equal(weight, state[f"lm.{name}"].to(torch.bfloat16)), name
    served = PolicyModel(tmp_path / "policy", bf16=False)
    assert next(served.parameters()).dtype == torch.float32
