"""The Ray Train path: 2 CPU workers take the same update as 1 process on the same batch (mini-batch
steps of the actor and of the separate critic, each mini-batch's rows split between the workers).
Slow (~1 min: Ray start-up)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragr1.services.trainer.loop import to_sample
from ragr1.services.trainer.ppo_trainer import PPOUpdater
from ragr1.services.trainer.ray_train import ray_update
from tests.trainer.rollouts import make_rollout, tiny_settings


@pytest.mark.slow
def test_two_ray_workers_take_the_same_update_as_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    import ray

    # 6 rollouts in 3 mini-batches of 2: three clipped steps of each model, one row per worker each.
    settings = tiny_settings(actor_lr=1e-3, critic_lr=1e-3, mini_batch_size=2, micro_batch_size=1, seed=3)
    samples = [to_sample(make_rollout(f"r{i}", score=float(i % 3), seed=i, generated=4 + i)) for i in range(6)]
    torch.manual_seed(settings.seed)
    single = PPOUpdater.build(settings, tiny_model_dir)
    start = single.state()
    expected = single.update(samples)
    assert expected["actor_steps"] == 3 and expected["critic_steps"] == 3
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        state, stats = ray_update(settings, tiny_model_dir, start, samples, num_workers=2, tmp_dir=tmp_path)
    finally:
        ray.shutdown()
    for model in ("actor", "critic"):
        moved = 0.0
        for name, value in single.state()[model].items():
            assert torch.allclose(state[model][name], value, atol=1e-5, rtol=1e-4), f"{model}: {name}"
            moved = max(moved, float((value - start[model][name]).abs().max()))
        assert moved > 1e-4, f"the update did not change the {model}; the comparison would be vacuous"
    assert stats["reward_mean"] == pytest.approx(expected["reward_mean"])
    for key in ("policy_loss", "value_loss", "clip_fraction", "ratio_max", "ratio_min", "approx_kl"):
        assert stats[key] == pytest.approx(expected[key], rel=1e-3, abs=1e-5), key
