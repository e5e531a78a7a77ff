"""PPO arithmetic: pure functions of tensors, no I/O, no model.

Shapes: ``[batch, T]`` over response tokens. ``mask`` is the rollout's loss mask: 1 for tokens the
policy generated, 0 for tokens the system inserted (``<information>`` passages) and for padding.
Masked tokens are not actions of the policy, so they get no advantage, no policy loss, no entropy
bonus and no KL term; their gradients are exactly zero because every term is multiplied by the mask
before reduction (never divided by a masked value).

Off-policy correction (decoupled PPO, as in AReaL): the rollout was sampled by a *behaviour* policy
(the weights the policy service had, possibly a version or more behind), ``old_logprobs`` are the
*proximal* policy's (the trainer's weights before this update, recomputed), and the clipped ratio is
taken against the proximal policy while the importance weight ``exp(old - behaviour)``, truncated at
``tis_cap``, corrects for the behaviour policy having sampled the tokens.

KL to the reference follows RAG-R1 / verl: by default a fixed-coefficient penalty subtracted from the
token rewards (``token_rewards``), so it flows through GAE; optionally a loss term (``actor_loss``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragr1.services.trainer.config import KLKind

# verl clamps its low-variance (k3) estimate here: exp(ref - logp) explodes when the policy has moved far.
K3_CLAMP = 10.0


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, denominator: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over unmasked entries; ``denominator`` overrides the count (the mini-batch's token count when
    it is split into micro-batches or across data-parallel workers, so that the shares add up to its mean)."""
    if denominator is None:
        denominator = mask.sum().clamp(min=1)
    return masked_sum(x, mask) / denominator


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over unmasked entries; masked entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def terminal_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Places each trajectory's outcome score on its last generated token (``[B]`` -> ``[B, T]``)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    has_action = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_action]
    rewards[rows, last[has_action]] = scores[has_action]
    return rewards


def token_rewards(
    scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """verl's ``apply_kl_penalty``: the outcome score on the last generated token, minus ``kl_coef`` × the
    per-token KL estimate on every generated token (``kl`` ``[B, T]``; None = no penalty)."""
    rewards = terminal_rewards(scores, mask)
    if kl is not None:
        rewards = rewards - kl_coef * kl * mask
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the generated tokens only.

    The decision steps of a trajectory are its generated tokens: inserted ``<information>`` tokens are
    skipped (the next step after a ``</search>`` is the first token the policy writes after the
    passages), so the passages neither discount nor bootstrap. Returns ``(advantages, returns)``,
    both 0 on masked tokens. The value after the last generated token is 0 (episodes end there).

    verl's recursion ``A_t = δ_t + γλ A_{t+1}`` over each row's generated tokens, in closed form: with the
    generated tokens packed to the left of each row, ``A_k = Σ_{j >= k} (γλ)^(j-k) δ_j`` is one product with
    a triangular matrix of powers. A loop over the positions would dispatch tens of operators per position
    (on a GPU, launches of a few microseconds each, for a response of thousands of tokens).
    """
    batch, length = rewards.shape
    live = mask > 0
    # Each row's generated positions first, in order (a stable sort moves the others behind them).
    order = torch.argsort((~live).to(torch.uint8), dim=1, stable=True)
    packed = live.gather(1, order).to(rewards.dtype)
    step_rewards = rewards.gather(1, order) * packed
    step_values = values.gather(1, order).to(rewards.dtype) * packed
    # The value of each step's successor: the next generated token's, 0 after the last one.
    successors = torch.cat([step_values[:, 1:], step_values.new_zeros(batch, 1)], dim=1)
    deltas = (step_rewards + gamma * successors - step_values) * packed
    offsets = torch.arange(length, device=rewards.device)
    ahead = offsets[None, :] - offsets[:, None]  # [k, j] = j - k
    discount = torch.tensor(gamma * lam, dtype=rewards.dtype, device=rewards.device)
    weights = torch.where(ahead >= 0, discount ** ahead.clamp(min=0).to(rewards.dtype), 0.0)
    advantages = torch.zeros_like(rewards).scatter(1, order, (deltas @ weights.T) * packed)
    returns = (advantages + values) * mask
    return advantages, returns


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: Sequence[str],
    mask: torch.Tensor,
    eps: float = 1e-6,
    scale: bool = True,
) -> torch.Tensor:
    """Group-relative advantages (GRPO): each score minus its group's mean (divided by the group's std
    when ``scale``), broadcast to the trajectory's generated tokens. A group of one gets 0."""
    if len(group_ids) != scores.shape[0]:
        raise ValueError(f"{len(group_ids)} group ids for {scores.shape[0]} scores")
    advantage = torch.zeros_like(scores)
    for group in set(group_ids):
        index = torch.tensor([i for i, g in enumerate(group_ids) if g == group], device=scores.device)
        members = scores[index]
        if members.numel() < 2:
            continue
        centred = members - members.mean()
        if scale:
            centred = centred / (members.std() + eps)
        advantage[index] = centred
    return advantage[:, None] * mask


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens.

    k1 = log π - log π_ref (unbiased, can be negative; RAG-R1's reward penalty); k3 = exp(-k1) - 1 + k1
    (unbiased, >= 0, lower variance; Schulman's estimator, verl's ``low_var_kl``, clamped as verl does).
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k3":
        return (torch.exp(-diff) - 1 + diff).clamp(max=K3_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1' or 'k3'")


def importance_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor | None, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """exp(proximal - behaviour), truncated at ``cap`` (truncated importance sampling), no gradient."""
    if behaviour_logprobs is None:
        return mask.to(old_logprobs.dtype)
    weights = torch.exp((old_logprobs - behaviour_logprobs).detach()).clamp(max=cap)
    return weights * mask


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    behaviour_logprobs: torch.Tensor | None = None,
    tis_cap: float = 2.0,
    denominator: float | torch.Tensor | None = None,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate, decoupled from the behaviour policy when its log-probs are given. The ratio is
    clipped to [1 - clip, 1 + clip_high] (``clip_high`` None: ``clip``; DAPO's clip-higher sets it above).

    Returns the loss and stats: ``clip_fraction`` (share of tokens whose ratio was clipped in the
    direction that matters), ``approx_kl`` (k1 between proximal and current), ``importance_weight``,
    ``ratio_mean``, ``ratio_min``, ``ratio_max`` (min and max over unmasked tokens).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip, 1 + (clip if clip_high is None else clip_high)) * advantages
    weights = importance_weights(old_logprobs, behaviour_logprobs, mask, tis_cap)
    per_token = -torch.minimum(unclipped, clipped) * weights
    loss = masked_mean(per_token, mask, denominator)
    with torch.no_grad():
        live = ratio[mask > 0]
        stats = {
            "clip_fraction": masked_mean((clipped < unclipped).to(logprobs.dtype), mask),
            "approx_kl": masked_mean(old_logprobs - logprobs, mask),
            "importance_weight": masked_mean(weights, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
        if live.numel():
            stats["ratio_min"], stats["ratio_max"] = live.min(), live.max()
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.5,
    denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped within ``clip`` of the old value."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    losses = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = 0.5 * masked_mean(losses, mask, denominator)
    with torch.no_grad():
        stats = {
            "value_loss": loss.detach(),
            "value_clip_fraction": masked_mean(
                ((clipped - returns) ** 2 > (values - returns) ** 2).to(values.dtype), mask
            ),
            "value_mean": masked_mean(values, mask),
        }
    return loss, stats


def tempered_logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token) and the entropy of softmax(logits / temperature), in float32 (``[N, V]``, ``[N]``,
    ``[N]``). Dividing by the temperature the rollout was sampled at is what makes these the behaviour
    distribution's log-probs (vLLM's processed log-probs; verl divides in every log-prob pass)."""
    logp = torch.log_softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return chosen, entropy


def actor_loss(
    *,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    entropy_coef: float,
    tis_cap: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k1",
    denominator: float | torch.Tensor | None = None,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss - entropy bonus (+ KL-to-reference loss when ``ref_logprobs`` is given: the
    ``kl_penalty = "loss"`` option; by default the KL is in the rewards instead).

    Every term is a masked mean over the same tokens, so ``<information>`` tokens contribute nothing.
    """
    loss, stats = policy_loss(
        logprobs, old_logprobs, advantages, mask, clip, behaviour_logprobs, tis_cap, denominator, clip_high
    )
    stats["policy_loss"] = loss.detach()
    ent = masked_mean(entropy, mask, denominator)
    stats["entropy"] = ent.detach()
    total = loss - entropy_coef * ent
    if ref_logprobs is not None:
        kl = masked_mean(kl_penalty(logprobs, ref_logprobs, kl_kind), mask, denominator)
        stats["kl_loss"] = kl.detach()
        total = total + kl_coef * kl
    return total, stats


def warmup_factor(update: int, warmup_updates: int) -> float:
    """Learning-rate multiplier of update ``update`` (0-based): a linear ramp over ``warmup_updates``
    updates, then constant (verl's constant schedule with warm-up). verl's ramp gives the first update
    rate 0, a wasted update; this one starts at 1/warmup_updates and reaches 1 on the last warm-up
    update."""
    if warmup_updates <= 0:
        return 1.0
    return min(1.0, (update + 1) / warmup_updates)


def logprob_gap(
    trainer: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, same_weights: Sequence[bool]
) -> dict[str, float]:
    """The weight-sync check: |trainer - behaviour| log-prob per generated token, over the rows
    ``same_weights`` marks (``trainer`` holds their log-probs under the weights that sampled them).
    Empty when there are none."""
    rows = torch.tensor(same_weights, dtype=torch.bool, device=mask.device)
    live = mask[rows] > 0
    if not bool(live.any()):
        return {}
    gaps = (trainer[rows] - behaviour[rows]).abs()[live]
    return {
        "logprob_gap": float(gaps.mean()),
        "logprob_gap_max": float(gaps.max()),
        "logprob_gap_rollouts": float(int(rows.sum())),
    }
