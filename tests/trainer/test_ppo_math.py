"""PPO arithmetic against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ragr1.services.trainer import ppo_math
from tests.trainer.rounding import rounding


def test_gae_with_unit_gamma_lambda_is_return_minus_value_and_skips_information_tokens() -> None:
    # Tokens 2 and 3 are inserted passages: their (absurd) values must not enter any estimate.
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4]])
    rewards = ppo_math.terminal_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    adv, ret = ppo_math.gae(rewards, values, mask)
    assert adv[0].tolist() == pytest.approx([0.5, 0.8, 0.0, 0.0, 0.6])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0])


def test_gae_with_discount_and_lambda() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4]])
    rewards = ppo_math.terminal_rewards(torch.tensor([1.0]), mask)
    adv, _ = ppo_math.gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=4: 1 - 0.4 = 0.6; t=1: (0.9*0.4 - 0.2) + 0.45*0.6 = 0.43; t=0: (0.9*0.2 - 0.5) + 0.45*0.43
    assert adv[0].tolist() == pytest.approx([-0.1265, 0.43, 0.0, 0.0, 0.6])


def test_terminal_reward_lands_on_last_generated_token_and_empty_rows_get_none() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert ppo_math.terminal_rewards(torch.tensor([2.0, 5.0]), mask).tolist() == [[0, 2, 0], [0, 0, 0]]


def test_clipped_policy_loss_by_hand() -> None:
    old = torch.zeros(1, 4)
    new = torch.tensor([[0.5, -0.5, -0.5, 3.0]])
    adv = torch.tensor([[1.0, 1.0, -2.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = ppo_math.policy_loss(new, old, adv, mask, clip=0.2)
    # min(1.6487, 1.2) = 1.2; min(0.6065, 0.8) = 0.6065; min(-1.2131, -1.6) = -1.6; token 4 masked
    expected = -(1.2 + math.exp(-0.5) - 1.6) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)
    # Ratio statistics over the unmasked tokens only (the masked ratio, e^3, is not among them).
    assert stats["ratio_max"].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert stats["ratio_min"].item() == pytest.approx(math.exp(-0.5), rel=1e-6)
    assert stats["ratio_mean"].item() == pytest.approx((math.exp(0.5) + 2 * math.exp(-0.5)) / 3, rel=1e-6)


def test_clip_higher_lets_a_rewarded_token_grow_further_and_keeps_the_lower_bound() -> None:
    """DAPO's clip-higher: the ratio's upper bound is 1 + clip_high, the lower stays 1 - clip."""
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.25), math.log(0.7)]])
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    symmetric, stats = ppo_math.policy_loss(new, old, adv, mask, clip=0.2)
    higher, higher_stats = ppo_math.policy_loss(new, old, adv, mask, clip=0.2, clip_high=0.28)
    # Token 1: 1.25 is past 1.2 but inside 1.28; token 2: 0.7 is clipped to 0.8 either way.
    assert symmetric.item() == pytest.approx(-(1.2 - 0.8) / 2, rel=1e-5)
    assert higher.item() == pytest.approx(-(1.25 - 0.8) / 2, rel=1e-5)
    assert (stats["clip_fraction"].item(), higher_stats["clip_fraction"].item()) == pytest.approx((1.0, 0.5))


def test_decoupled_importance_weight_is_truncated() -> None:
    old = torch.zeros(1, 2)
    behaviour = torch.tensor([[0.0, -3.0]])  # second token: exp(3) = 20 -> truncated to 2
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    loss, stats = ppo_math.policy_loss(old.clone(), old, adv, mask, behaviour_logprobs=behaviour, tis_cap=2.0)
    assert loss.item() == pytest.approx(-(1.0 + 2.0) / 2)
    assert stats["importance_weight"].item() == pytest.approx(1.5)


def test_clipped_value_loss_by_hand() -> None:
    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[1.0, 0.2]])
    ret = torch.tensor([[2.0, 0.0]])
    mask = torch.ones(1, 2)
    loss, _ = ppo_math.value_loss(new, old, ret, mask, clip=0.5)
    # token 1: max((1-2)^2, (0.5-2)^2) = 2.25; token 2: max(0.04, 0.04) = 0.04
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.04) / 2)


def test_kl_estimators() -> None:
    logp = torch.tensor([-1.0, -2.0, -20.0])
    ref = torch.tensor([-1.5, -1.0, -1.0])
    assert ppo_math.kl_penalty(logp, ref, "k1").tolist() == pytest.approx([0.5, -1.0, -19.0])
    # k3 = exp(ref - logp) - (ref - logp) - 1, clamped at 10 as verl's low_var_kl.
    assert ppo_math.kl_penalty(logp, ref, "k3").tolist() == pytest.approx(
        [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, 10.0]
    )
    with pytest.raises(ValueError, match="k2"):
        ppo_math.kl_penalty(logp, ref, "k2")  # type: ignore[arg-type]


def test_k1_penalty_in_the_token_rewards_flows_through_gae_by_hand() -> None:
    # RAG-R1: reward_t = score·[t last] - β·(old_t - ref_t) on generated tokens; token 2 is inserted.
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    old = torch.tensor([[-1.0, -2.0, -7.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -3.0, -0.25]])
    kl = ppo_math.kl_penalty(old, ref, "k1") * mask
    rewards = ppo_math.token_rewards(torch.tensor([1.0]), mask, kl, kl_coef=0.1)
    assert rewards[0].tolist() == pytest.approx([-0.05, 0.1, 0.0, 1.025])
    values = torch.tensor([[0.3, 0.2, 5.0, 0.1]])
    adv, ret = ppo_math.gae(rewards, values, mask)
    # γ = λ = 1: the return is the sum of the rewards still to come, the advantage that minus the value.
    assert ret[0].tolist() == pytest.approx([1.075, 1.125, 0.0, 1.025])
    assert adv[0].tolist() == pytest.approx([0.775, 0.925, 0.0, 0.925])


def test_warmup_ramps_from_the_first_update_to_the_full_rate() -> None:
    assert [ppo_math.warmup_factor(u, 4) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert ppo_math.warmup_factor(0, 0) == 1.0


def test_grpo_advantages_are_group_relative() -> None:
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0])
    mask = torch.tensor([[1.0, 0.0]] * 5)
    adv = ppo_math.grpo_advantages(scores, ["a", "a", "b", "b", "c"], mask, scale=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0])
    assert adv[:, 1].tolist() == [0.0] * 5
    scaled = ppo_math.grpo_advantages(scores, ["a", "a", "b", "b", "c"], mask)
    assert scaled[0, 0].item() == pytest.approx(0.5 / math.sqrt(0.5), rel=1e-4)


def test_gradients_on_masked_information_tokens_are_exactly_zero_in_every_term() -> None:
    torch.manual_seed(0)
    batch, length, vocab = 2, 6, 11
    logits = torch.randn(batch, length, vocab, requires_grad=True)
    values = torch.randn(batch, length, requires_grad=True)
    tokens = torch.randint(0, vocab, (batch, length))
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0]], dtype=torch.float32)
    temperature = torch.full((batch * length,), 0.7)
    logprobs, entropy = ppo_math.tempered_logprobs_and_entropy(logits.flatten(0, 1), tokens.flatten(), temperature)
    with torch.no_grad():
        old = logprobs.view(batch, length) + 0.1 * torch.randn(batch, length)
        ref = old - 0.2
        behaviour = old + 0.3
    kl = ppo_math.kl_penalty(old, ref) * mask
    rewards = ppo_math.token_rewards(torch.tensor([1.0, -1.0]), mask, kl, 0.001)
    adv, ret = ppo_math.gae(rewards, values.detach(), mask)
    for kl_kind in ("k1", "k3"):
        logits.grad = values.grad = None
        actor, stats = ppo_math.actor_loss(
            logprobs=logprobs.view(batch, length),
            entropy=entropy.view(batch, length),
            old_logprobs=old,
            behaviour_logprobs=behaviour,
            advantages=adv,
            mask=mask,
            clip=0.2,
            entropy_coef=0.001,
            tis_cap=2.0,
            ref_logprobs=ref,
            kl_coef=0.001,
            kl_kind=kl_kind,  # type: ignore[arg-type]
        )
        critic, vstats = ppo_math.value_loss(values, values.detach() + 0.1, ret, mask, clip=0.5)
        (actor + critic).backward(retain_graph=True)
        assert logits.grad is not None and values.grad is not None
        masked = mask == 0
        assert torch.count_nonzero(logits.grad[masked]) == 0
        assert torch.count_nonzero(values.grad[masked]) == 0
        assert torch.count_nonzero(logits.grad[~masked]) > 0
        assert set(stats) >= {"policy_loss", "entropy", "kl_loss", "clip_fraction", "ratio_min", "ratio_max"}
        assert "value_loss" in vstats


def test_tempered_log_probs_are_those_of_the_scaled_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    lp, entropy = ppo_math.tempered_logprobs_and_entropy(logits, torch.tensor([0]), torch.tensor([0.5]))
    scaled = torch.softmax(logits / 0.5, dim=-1)[0]
    assert lp.item() == pytest.approx(math.log(scaled[0].item()), rel=1e-6)
    assert entropy.item() == pytest.approx(-(scaled * scaled.log()).sum().item(), rel=1e-6)


def looped_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's backward recursion, one position at a time, skipping the masked ones."""
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(batch, dtype=rewards.dtype)
    running = torch.zeros(batch, dtype=rewards.dtype)
    for t in reversed(range(length)):
        m = mask[:, t].to(rewards.dtype)
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        running = m * step + (1 - m) * running
        next_value = m * values[:, t] + (1 - m) * next_value
        advantages[:, t] = m * step
    return advantages, (advantages + values) * mask


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 1.0)])
def test_gae_in_closed_form_is_the_backward_recursion(gamma: float, lam: float) -> None:
    generator = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 300, generator=generator) < 0.4).float()
    mask[3] = 0  # a row with nothing generated
    mask[4, 299] = 1  # a last position generated
    values = torch.randn(5, 300, generator=generator)
    rewards = torch.randn(5, 300, generator=generator) * mask
    adv, ret = ppo_math.gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = looped_gae(rewards, values, mask, gamma, lam)
    # The same sums in another order: rounding of a row's terms (a reward and two values a step).
    allowed = rounding(300, float((rewards.abs() + 2 * values.abs()).sum(dim=1).max()))
    assert float((adv - want_adv).abs().max()) <= allowed and float((ret - want_ret).abs().max()) <= allowed
    assert float(adv[mask == 0].abs().max()) == 0.0 and float(ret[mask == 0].abs().max()) == 0.0
