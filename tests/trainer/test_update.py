"""The PPO update as RAG-R1 runs it, on the tiny model: clipped mini-batch steps, a critic that never
moves the actor (nor the actor the critic), the k1 penalty in the rewards (a k3 loss under GRPO), warm-up,
settings refused."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from ragr1.services.trainer import ppo_math
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop import to_sample
from ragr1.services.trainer.updater import PPOUpdater, Sample
from tests.trainer.command import run_train_ppo
from tests.trainer.rollouts import make_rollout, tiny_settings
from tests.trainer.rounding import rounding


def on_policy_samples(n: int = 4, group_size: int = 2) -> list[Sample]:
    """Rollouts scored 1, 0, 0.5, 0, … in groups, with no behaviour log-probs (sampled by the trainer's
    own weights, so every importance weight is 1)."""
    samples = []
    for i in range(n):
        sample = to_sample(
            make_rollout(f"r{i}", score=[1.0, 0.0, 0.5, 0.0][i % 4], seed=i, group=f"g{i // group_size}")
        )
        sample.behaviour_logprobs = None
        samples.append(sample)
    return samples


def test_the_clip_acts_once_a_mini_batch_step_has_moved_the_policy(tiny_model_dir: Path) -> None:
    samples = on_policy_samples()
    results = {}
    for mini_batch_size in (4, 2):
        torch.manual_seed(0)
        settings = tiny_settings(advantage="grpo", actor_lr=5e-2, kl_coef=0.0, mini_batch_size=mini_batch_size)
        updater = PPOUpdater.build(settings, tiny_model_dir)
        if mini_batch_size == 4:
            # The ratio's log-probs and the proximal ones come from the same weights in other passes: exp of the
            # difference of two roundings of log-probs this large.
            logprobs = float(updater.prepare(samples).old_logprobs.abs().max())
            near_one = math.expm1(rounding(updater.actor.base().config.vocab_size, logprobs))
        results[mini_batch_size] = updater.update(samples)
    # One step per batch (the old trainer): the ratio is 1 everywhere and nothing is ever clipped.
    whole = results[4]
    assert whole["actor_steps"] == 1
    assert whole["clip_fraction"] == 0.0
    assert abs(whole["ratio_min"] - 1) <= near_one and abs(whole["ratio_max"] - 1) <= near_one
    # Two mini-batches: the second is scored by a policy the first step moved, out of [0.8, 1.2].
    split = results[2]
    assert split["actor_steps"] == 2
    assert split["ratio_max"] > 1.2 or split["ratio_min"] < 0.8
    assert split["clip_fraction"] > 0.0
    assert split["approx_kl"] != 0.0


@pytest.mark.parametrize(("lora_rank", "rates"), [(0, [1e-6, 1e-5]), (4, [1e-4, 1e-4])])
def test_the_optimisers_start_from_the_learning_rates_of_the_parameterisation(
    tiny_model_dir: Path, lora_rank: int, rates: list[float]
) -> None:
    updater = PPOUpdater.build(tiny_settings(lora_rank=lora_rank), tiny_model_dir)
    assert [p.name for p in updater.parts] == ["actor", "critic"]
    assert [p.optimizer.param_groups[0]["lr"] for p in updater.parts] == rates
    assert [p.lr for p in updater.parts] == rates


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_critic_and_actor_steps_never_touch_each_others_weights(tiny_model_dir: Path, lora_rank: int) -> None:
    updater = PPOUpdater.build(
        tiny_settings(lora_rank=lora_rank, actor_lr=1e-2, critic_lr=1e-2, kl_coef=0.001), tiny_model_dir
    )
    assert updater.critic is not None
    prepared = updater.prepare(on_policy_samples())

    def snapshot() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        assert updater.critic is not None
        return (
            {k: v.clone() for k, v in updater.actor.state_dict().items()},
            {k: v.clone() for k, v in updater.critic.state_dict().items()},
        )

    actor0, critic0 = snapshot()
    updater.step("critic", prepared, range(4))
    actor1, critic1 = snapshot()
    assert all(torch.equal(actor0[k], actor1[k]) for k in actor0), "a critic step moved the actor"
    assert any(not torch.equal(critic0[k], critic1[k]) for k in critic0), "the critic step changed nothing"
    updater.step("actor", prepared, range(4))
    actor2, critic2 = snapshot()
    assert all(torch.equal(critic1[k], critic2[k]) for k in critic1), "an actor step moved the critic"
    assert any(not torch.equal(actor1[k], actor2[k]) for k in actor1), "the actor step changed nothing"
    trainable = {id(p) for p in updater.actor.actor_parameters()}
    assert not trainable & {id(p) for p in updater.critic.critic_parameters()}


@pytest.mark.parametrize("kl_penalty", ["auto", "reward", "loss"])
def test_k1_penalty_goes_into_the_rewards_by_default(tiny_model_dir: Path, kl_penalty: str) -> None:
    samples = on_policy_samples()
    # As a loss the estimator would default to k3; k1 here, so that the KL stat is the same in every case.
    kind = "k1" if kl_penalty == "loss" else "auto"
    settings = tiny_settings(actor_lr=5e-2, kl_coef=0.5, kl_penalty=kl_penalty, kl_kind=kind, whiten_advantages=False)
    updater = PPOUpdater.build(settings, tiny_model_dir)
    updater.update(samples)  # the actor leaves its reference
    prepared = updater.prepare(samples)
    mask = prepared.batch.mask
    assert prepared.returns is not None and prepared.old_values is not None
    ref = torch.cat([updater.actor.reference_logprobs(prepared.batch.select([i])) for i in range(4)])
    k1 = (prepared.old_logprobs - ref) * mask
    # A mean of differences of log-probs from other passes: their rounding, not its own size's.
    vocabulary = updater.actor.base().config.vocab_size
    rounded = rounding(vocabulary, float(ref.abs().max()))
    assert abs(float(prepared.stats["kl"]) - float(k1.sum() / mask.sum())) <= rounded
    assert float(k1.abs().sum()) > 1e-3, "the actor did not move: the test would not see the penalty"
    score = prepared.scores[:, None]
    if kl_penalty != "loss":  # auto with GAE: RAG-R1's PPO
        # γ = λ = 1: the return at t is the score minus β × the k1 still to come.
        expected = (score - 0.5 * k1.flip(1).cumsum(1).flip(1)) * mask
        assert prepared.ref_logprobs is None
    else:
        expected = score * mask
        assert prepared.ref_logprobs is not None
    # Each return sums up to a row's length of β k1 terms, each as far off as two log-probs' rounding.
    assert torch.allclose(prepared.returns, expected, rtol=0, atol=0.5 * mask.shape[1] * rounded)


def test_grpo_keeps_the_kl_out_of_the_group_normalisation(tiny_model_dir: Path) -> None:
    """A GRPO group whose samples all scored the same teaches nothing, however far the actor has moved from
    its reference: the KL is a k3 loss term (verl's GRPO), not a part of the score the group is normalised by."""
    settings = tiny_settings(advantage="grpo", actor_lr=5e-2, kl_coef=0.5)
    assert (settings.kl_in_reward, settings.kl_estimator) == (False, "k3")
    updater = PPOUpdater.build(settings, tiny_model_dir)
    samples = on_policy_samples()
    updater.update(samples)  # the actor leaves its reference
    for sample in samples:
        sample.score = 0.5
    prepared = updater.prepare(samples)
    assert prepared.stats["kl"] > 1e-4, "the actor did not move: the test would not see the KL"
    assert prepared.ref_logprobs is not None
    assert torch.count_nonzero(prepared.advantages) == 0


def test_learning_rates_warm_up_over_a_share_of_max_updates(tiny_model_dir: Path) -> None:
    settings = tiny_settings(
        actor_lr=3e-3, critic_lr=2e-3, max_updates=10, actor_warmup_ratio=0.3, critic_warmup_ratio=0.15
    )
    assert (settings.warmup_updates(0.3), settings.warmup_updates(0.15)) == (3, 1)
    updater = PPOUpdater.build(settings, tiny_model_dir)
    samples = on_policy_samples()
    rates = [updater.update(samples) for _ in range(4)]
    assert [r["actor_lr"] for r in rates] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3])
    assert [r["critic_lr"] for r in rates] == pytest.approx([2e-3] * 4)
    assert dataclasses.replace(settings, max_updates=0).warmup_updates(0.3) == 0  # unbounded run: no warm-up
    assert [ppo_math.warmup_factor(u, 3) for u in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_size": 16, "mini_batch_size": 5}, r"batch_size \(16\) must be a multiple of mini_batch_size \(5\)"),
        ({"advantage": "grpo", "samples_per_prompt": 1}, "advantage=grpo needs samples_per_prompt of at least 2"),
        ({"max_uniform_groups": 2}, "max_uniform_groups needs samples_per_prompt of at least 2"),
        ({"max_uniform_groups": -1}, "max_uniform_groups must be at least 0"),
        ({"kl_penalty": "advantage"}, "kl_penalty must be one of"),
        ({"kl_kind": "k2"}, "kl_kind must be one of"),
        ({"advantage": "grpo", "samples_per_prompt": 2, "kl_penalty": "reward"},
         "kl_penalty=reward with advantage=grpo: GRPO divides each group's summed rewards by their spread"),
        ({"sharding": "zero3"}, "sharding must be one of fsdp, replicate, got 'zero3'"),
        ({"actor_warmup_ratio": 1.5}, "actor_warmup_ratio must be within"),
        ({"micro_batch_tokens": -1}, "micro_batch_tokens must be at least 0"),
    ],
)
def test_bad_settings_are_refused_naming_them(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PPOConfig(), **change)  # type: ignore[arg-type]


def test_ragr1_train_ppo_refuses_split_grpo_groups_before_anything_starts(tmp_path: Path) -> None:
    result = run_train_ppo(
        "--advantage", "grpo",
        "--samples-per-prompt", "4",
        "--batch-size", "6",
        "--mini-batch-size", "2",
        "--output-dir", str(tmp_path / "out"),
        "--redis-url", "redis://127.0.0.1:1/0",
    )
    assert result.returncode == 2
    assert "batch_size (6) must be a multiple of samples_per_prompt (4)" in result.stderr.decode()
    assert not (tmp_path / "out").exists()
