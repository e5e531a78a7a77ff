"""The PPO update that keeps its tensors on the models' device (issue 44) takes the step the host-side
update took: the same losses, statistics, gradients and weights, on the tiny model, to float32 rounding.

The reference below is the update as it was computed before: the networks' outputs brought to the CPU
(whole-vocabulary log-softmax of the full logits, no chunking, no checkpointing), the losses computed
there, every statistic read as a number after each micro-batch and the gradient norm after each step.
It shares only the PPO arithmetic (``ppo_math``), the mini-batch order and the micro-batch grouping with
the code it checks.

Step by step: the reference takes each optimiser step from the weights the update had before that step
(recorded), computes its own gradients and statistics there, and steps its own optimiser with the gradients
the update used. Run apart for four steps at these learning rates, two float32 updates differ by far more
than rounding: AdamW divides by the root of the gradients' second moment, so an entry whose gradient is near
its ε (1e-8) moves by a share of the learning rate set by its rounding, and every later gradient is taken at
those weights. In step, every comparison is of one step's arithmetic from the same weights, and its tolerance
is that arithmetic's rounding (``tests/trainer/rounding.py``)."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ragr1.services.trainer import ppo_math
from ragr1.services.trainer.loop import to_sample
from ragr1.services.trainer.model import Batch, collate, micro_batches
from ragr1.services.trainer.updater import PPOUpdater, Sample
from tests.trainer.rollouts import make_rollout, tiny_settings
from tests.trainer.rounding import U32, rounding


def samples(n: int = 6) -> list[Sample]:
    """Rollouts of different lengths and temperatures, with behaviour log-probs (set by ``sampled_by``)."""
    out = []
    for i in range(n):
        rollout = make_rollout(
            f"r{i}", score=[1.0, 0.0, 0.5][i % 3], seed=i, generated=4 + i, inserted=3 + i % 2,
            temperature=[1.0, 0.7][i % 2], group=f"g{i // 2}",
        )
        sample = to_sample(rollout)
        sample.weights_lag = 0
        out.append(sample)
    return out


def sampled_by(updater: PPOUpdater, rollouts: list[Sample]) -> None:
    """Behaviour log-probs as a sampler of nearly the trainer's weights gives them: its own log-probs
    within ±0.1 (importance weights 0.9-1.1; the weight-sync check measures the gap), and 1 lower on the
    first rollout, whose weights e ≈ 2.7 the cap truncates. Far-off ones would make every importance
    weight ~0 and with it the policy gradient, which the comparison is for."""
    batch = collate([x.sequence for x in rollouts], updater.actor.pad_id, [x.temperature for x in rollouts])
    with torch.no_grad():
        own = host_logprobs(updater.actor.base(), batch)[0]
    generator = torch.Generator().manual_seed(1)
    for i, x in enumerate(rollouts):
        n = len(x.sequence.response_ids)
        offset = (torch.rand(n, generator=generator) - 0.5) * 0.2 - (1.0 if i == 0 else 0.0)
        x.behaviour_logprobs = (own[i, :n] + offset * batch.mask[i, :n]).tolist()


def host_logprobs(network: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, R]`` log-probs and entropies on the CPU from the full logits, 0 where the mask is 0."""
    logits = network(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logits = logits.float().cpu() / batch.temperature[:, None, None]
    at = logits[torch.arange(len(batch))[:, None], batch.positions]  # [B, R, V]
    logp = torch.log_softmax(at, dim=-1)
    chosen = logp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return chosen * batch.mask, entropy * batch.mask


def host_values(critic: Any, batch: Batch) -> torch.Tensor:
    hidden = critic.trunk(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)[0]
    at = hidden[torch.arange(len(batch))[:, None], batch.positions]
    return critic.value_head(at.float()).squeeze(-1).cpu() * batch.mask


@dataclasses.dataclass
class Taken:
    """One optimiser step: the network's trainable weights before it, the (clipped) gradients it stepped
    with, and the weights after it."""

    part: str
    before: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    after: list[torch.Tensor]


def record_steps(updater: PPOUpdater) -> list[Taken]:
    """Every optimiser step ``updater`` takes from now on, in order."""
    taken: list[Taken] = []
    for part in updater.parts:

        def step(*args: Any, part: Any = part, original: Any = part.optimizer.step, **kwargs: Any) -> Any:
            before = [p.detach().clone() for p in part.params]
            grads = [None if p.grad is None else p.grad.detach().clone() for p in part.params]
            result = original(*args, **kwargs)
            taken.append(Taken(part.name, before, grads, [p.detach().clone() for p in part.params]))
            return result

        part.optimizer.step = step  # type: ignore[method-assign]
    return taken


@dataclasses.dataclass
class Replayed:
    """The reference's side of one step: its gradients (clipped) and the weights its optimiser stepped to."""

    part: str
    grads: list[torch.Tensor | None]
    after: list[torch.Tensor]


def set_weights(params: list[torch.nn.Parameter], values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)


def reference_update(
    updater: PPOUpdater, rollouts: list[Sample], taken: list[Taken]
) -> tuple[dict[str, float], list[Replayed], dict[str, float]]:
    """One update of ``updater`` (a copy of the one that took ``taken``), computed on the host as before,
    each step from the weights ``taken`` had before it. Returns the statistics, the steps, and the scales
    of the terms the statistics are computed from."""
    s = updater.settings
    actor, critic = updater.actor, updater.critic
    assert critic is not None and actor.reference is not None
    for part in updater.parts:
        part.set_learning_rate(updater.updates)
    batch = collate([x.sequence for x in rollouts], actor.pad_id, [x.temperature for x in rollouts])
    mask = batch.mask
    with torch.no_grad():
        old = host_logprobs(actor.base(), batch)[0]
        ref = host_logprobs(actor.reference, batch)[0]
        old_values = host_values(critic, batch)
    kl = ppo_math.kl_penalty(old, ref, s.kl_estimator) * mask  # type: ignore[arg-type]
    behaviour = old.clone()
    for i, x in enumerate(rollouts):
        assert x.behaviour_logprobs is not None
        behaviour[i, : len(x.behaviour_logprobs)] = torch.tensor(x.behaviour_logprobs)
    behaviour = torch.where(mask > 0, behaviour, old)
    stats: dict[str, float] = {"kl": float(ppo_math.masked_mean(kl, mask))}
    stats.update(ppo_math.logprob_gap(old, behaviour, mask, [True] * len(rollouts)))
    scores = torch.tensor([x.score for x in rollouts])
    rewards = ppo_math.token_rewards(scores, mask, kl, s.kl_coef)
    advantages, returns = ppo_math.gae(rewards, old_values, mask, s.gamma, s.lam)
    if s.whiten_advantages:
        advantages = ppo_math.masked_whiten(advantages, mask)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    lowest, highest = math.inf, -math.inf
    norms: dict[str, list[float]] = {"actor": [], "critic": []}
    shared = {"policy_loss", "entropy", "kl_loss", "value_loss"}
    replayed: list[Replayed] = []
    values_seen = float(old_values.abs().max())
    for epoch in range(s.ppo_epochs):
        for name in ("critic", "actor"):
            part = next(p for p in updater.parts if p.name == name)
            for mini in updater._mini_batches(len(rollouts), epoch):
                recorded = taken[len(replayed)]
                assert recorded.part == name, f"step {len(replayed)}: the update stepped the {recorded.part}"
                set_weights(part.params, recorded.before)
                part.optimizer.zero_grad(set_to_none=True)
                denominator = float(mask[mini].sum().clamp(min=1))
                for rows in micro_batches(batch, mini, s.micro_batch_size, s.micro_batch_tokens):
                    micro, sel = batch.select(rows), torch.tensor(rows)
                    if name == "actor":
                        logprobs, entropy = host_logprobs(actor.base(), micro)
                        loss, step = ppo_math.actor_loss(
                            logprobs=logprobs, entropy=entropy, old_logprobs=old[sel],
                            behaviour_logprobs=behaviour[sel], advantages=advantages[sel], mask=micro.mask,
                            clip=s.clip, entropy_coef=s.entropy_coef, tis_cap=s.tis_cap, denominator=denominator,
                        )
                    else:
                        values = host_values(critic, micro)
                        values_seen = max(values_seen, float(values.detach().abs().max()))
                        loss, step = ppo_math.value_loss(
                            values, old_values[sel], returns[sel], micro.mask, s.value_clip, denominator,
                        )
                    tokens = float(micro.mask.sum())
                    for key, value in step.items():
                        if key == "ratio_min":
                            lowest = min(lowest, float(value))
                        elif key == "ratio_max":
                            highest = max(highest, float(value))
                        else:
                            scale = denominator if key in shared else tokens
                            sums[key] = sums.get(key, 0.0) + float(value) * scale
                            weights[key] = weights.get(key, 0.0) + tokens
                    loss.backward()
                norms[name].append(float(torch.nn.utils.clip_grad_norm_(part.params, part.max_grad_norm)))
                grads = [None if p.grad is None else p.grad.clone() for p in part.params]
                # The step itself from the update's gradients: what the optimiser does with a gradient is
                # checked apart from how the gradient was computed.
                for p, g in zip(part.params, recorded.grads, strict=True):
                    p.grad = None if g is None else g.clone()
                part.optimizer.step()
                replayed.append(Replayed(name, grads, [p.detach().clone() for p in part.params]))
    stats.update({k: sums[k] / weights[k] for k in sums})
    stats.update({"ratio_min": lowest, "ratio_max": highest})
    for name, values in norms.items():
        stats[f"{name}_grad_norm"] = sum(values) / len(values)
        stats[f"{name}_grad_norm_max"] = max(values)
    reinforced = [i for i in range(len(rollouts)) if float((advantages[i] * mask[i]).sum()) > 0]
    actor_part = next(p for p in updater.parts if p.name == "actor")
    set_weights(actor_part.params, [t for t in taken if t.part == "actor"][-1].after)
    with torch.no_grad():
        after = host_logprobs(actor.base(), batch.select(reinforced))[0]
    stats["likelihood_change"] = float(ppo_math.masked_mean(after - old[reinforced], mask[reinforced]))
    stats["reward_mean"] = float(scores.mean())
    live = mask > 0
    scales = {
        "logprob": float(torch.cat([old[live], after[mask[reinforced] > 0]]).abs().max()),
        "advantage": float(advantages.abs().max()),
        "value": max(values_seen, float(returns.abs().max())),
        "tokens": float(mask.sum()),
    }
    return stats, replayed, scales


def tolerances(
    expected: dict[str, float], scales: dict[str, float], vocabulary: int, tis_cap: float
) -> dict[str, float]:
    """How far each statistic may stray by rounding alone: ``rounding`` of the terms it is computed from.
    The longest sum behind every one of them is the vocabulary's (a log-softmax; the critic's trunk shares
    the actor's embedding width, and its sums are shorter)."""
    logp, ratio = scales["logprob"], max(1.0, expected["ratio_max"])

    def within(scale: float) -> float:
        return rounding(vocabulary, scale)

    out = {
        # Means and extremes of log-probs and of their differences: the log-probs' rounding.
        **dict.fromkeys(("kl", "approx_kl", "likelihood_change", "logprob_gap", "logprob_gap_max"), within(logp)),
        # The entropy sums p log p over the vocabulary: terms up to log V.
        "entropy": within(math.log(vocabulary)),
        # exp(d) moves by exp(d) times d's rounding.
        **dict.fromkeys(("ratio_mean", "ratio_min", "ratio_max"), within(ratio * logp)),
        "importance_weight": within(tis_cap * logp),
        # -min(r A, clip(r) A) w: its derivative in the log-probs is at most |A| r w.
        "policy_loss": within(scales["advantage"] * ratio * tis_cap * logp),
        # Values are a dot product of a trunk's last hidden state; (v - R)^2 moves by 2 |v - R| times v's.
        "value_mean": within(scales["value"]),
        "value_loss": within(2 * scales["value"] ** 2),
        # Counts of tokens past a clip boundary: equal, unless a token sits within rounding of one.
        **dict.fromkeys(("clip_fraction", "value_clip_fraction"), 1.0 / scales["tokens"]),
        "logprob_gap_rollouts": 0.0,
        "reward_mean": 0.0,
    }
    for key in ("actor_grad_norm", "actor_grad_norm_max", "critic_grad_norm", "critic_grad_norm_max"):
        out[key] = within(expected[key])
    missing = set(expected) - set(out)
    assert not missing, f"no tolerance for {sorted(missing)}"
    return out


def run_both(tiny_model_dir: Path, mini_batch_size: int) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """One update on the device and its reference; the update's statistics and every comparison as
    (what, how far apart, how far rounding may take them)."""
    torch.manual_seed(0)
    # Large rates, so that the second mini-batch's ratios leave the clip range and the steps differ.
    settings = tiny_settings(
        actor_lr=2e-2, critic_lr=2e-2, kl_coef=0.05, mini_batch_size=mini_batch_size, micro_batch_size=2,
        logit_chunk_tokens=5, gradient_checkpointing=True, ppo_epochs=2,
    )
    updater = PPOUpdater.build(settings, tiny_model_dir)
    reference = copy.deepcopy(updater)
    rollouts = samples()
    sampled_by(updater, rollouts)
    taken = record_steps(updater)

    got = updater.update(rollouts)
    expected, replayed, scales = reference_update(reference, rollouts, taken)

    assert got["actor_steps"] == got["critic_steps"] == 2 * (6 // mini_batch_size) == len(taken) / 2
    assert [t.part for t in taken] == [r.part for r in replayed]
    vocabulary = updater.actor.base().config.vocab_size
    allowed = tolerances(expected, scales, vocabulary, settings.tis_cap)
    compared = [(f"statistic {key}", abs(got[key] - value), allowed[key]) for key, value in expected.items()]
    networks = {"actor": updater.actor, "critic": updater.critic}
    for index, (mine, theirs) in enumerate(zip(taken, replayed, strict=True)):
        network = networks[mine.part]
        assert network is not None
        names = [n for n, p in network.named_parameters() if p.requires_grad and not n.startswith("reference.")]
        for name, g, h, w, v in zip(names, mine.grads, theirs.grads, mine.after, theirs.after, strict=True):
            where = f"step {index} ({mine.part}) {name}"
            assert (g is None) == (h is None), where
            if g is not None and h is not None:
                # Each entry sums over the batch's tokens products whose size the tensor's largest entry
                # bounds, through a backward whose longest sum is the output layer's, over the vocabulary.
                compared.append((f"gradient {where}", float((g - h).abs().max()),
                                 rounding(vocabulary, float(h.abs().max()))))
            # The same optimiser step from the same weights and gradient: AdamW's few operations per entry,
            # each rounded once, relative to the weights.
            compared.append((f"weights {where}", float((w - v).abs().max()), 8 * U32 * float(v.abs().max())))
    return got, compared


@pytest.mark.parametrize("mini_batch_size", [6, 3])
def test_the_update_on_the_device_takes_the_host_side_step(tiny_model_dir: Path, mini_batch_size: int) -> None:
    got, compared = run_both(tiny_model_dir, mini_batch_size)
    if mini_batch_size == 3:
        assert got["clip_fraction"] > 0  # the clip acted: the comparison covers the clipped branch
    apart = [f"{what}: {error:.3g} apart, rounding allows {allowed:.3g}" for what, error, allowed in compared
             if not error <= allowed]
    assert not apart, f"{len(apart)} of {len(compared)} apart:\n" + "\n".join(apart[:12])


def test_the_statistics_and_gradient_norms_stay_tensors_until_the_update_reads_them(tiny_model_dir: Path) -> None:
    """Within a mini-batch nothing is read back as a number but the CPU batch's bookkeeping (which rows,
    how many tokens): on a GPU every other read makes the host wait for the device. Here a read from
    anywhere else while ``step`` runs fails."""
    updater = PPOUpdater.build(tiny_settings(kl_coef=0.05, mini_batch_size=3), tiny_model_dir)
    prepared = updater.prepare(samples())
    # The CPU batch's bookkeeping, and AdamW's step count (a host tensor unless the step is fused).
    host = {"tokens", "_passes", "micro_batches", "select", "_get_value"}
    reads: list[str] = []

    def guarded(original: Any) -> Any:
        def read(self: torch.Tensor, *args: Any) -> Any:
            callers = [sys._getframe(depth).f_code.co_name for depth in (1, 2)]
            # callers[0] == "read": one of these methods calling another, counted once already.
            if callers[0] != "read" and not host & set(callers):
                reads.append(callers[0])
            return original(self, *args)

        return read

    with pytest.MonkeyPatch.context() as patch:
        for method in ("__float__", "__int__", "__bool__", "item", "tolist"):
            patch.setattr(torch.Tensor, method, guarded(getattr(torch.Tensor, method)))
        stats = [updater.step(model, prepared, [0, 1, 2]) for model in ("critic", "actor")]
    assert reads == [], sorted(set(reads))
    assert all(isinstance(n, torch.Tensor) for p in updater.parts for n in p.grad_norms)
    assert stats[1].sums.device == updater.device
    assert math.isfinite(stats[1].result()["policy_loss"]) and stats[0].result()["value_loss"] >= 0
