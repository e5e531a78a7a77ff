"""PPO learns: SmolLM2-135M (LoRA r16, bf16 autocast where the CPU has native bfloat16), sampled
in-process, learns to answer with the word its prompt gives it, inside <answer> tags: the mean reward of the
last two samplings (after three and four updates) is well above that of the first two (before any update and
after one). Slow: sampling and PPO updates on the CPU."""

from __future__ import annotations

import random

import pytest
import torch

from ragr1.model_paths import prepare_policy_model
from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.model import PolicyModel
from ragr1.services.trainer.updater import PPOUpdater, Sample
from tests.trainer.sampler import answer_reward, sample

WORDS = [
    "apple",
    "river",
    "tiger",
    "cloud",
    "stone",
    "piano",
    "lemon",
    "rocket",
    "garden",
    "silver",
    "candle",
    "forest",
    "violet",
    "harbor",
    "mirror",
    "pepper",
]
# The reward of a sampling is that of the weights before its own update, so the last sampling has none after it.
UPDATES = 4
PROMPTS_PER_UPDATE = 4
SAMPLES_PER_PROMPT = 4


@pytest.mark.slow
def test_group_relative_ppo_raises_the_reward_of_a_small_pretrained_model() -> None:
    torch.manual_seed(0)
    model = PolicyModel(prepare_policy_model(), lora_rank=16)
    # The shipped update (4 clipped mini-batch steps per batch of 16, AdamW with weight decay), GRPO,
    # with a learning rate and no warm-up that let 4 updates show the rise; without activation checkpointing,
    # which only trades compute for memory these short sequences do not need (the same numbers:
    # tests/trainer/test_model.py).
    settings = PPOSettings(
        gradient_checkpointing=False,
        actor_lr=5e-4,
        actor_warmup_ratio=0.0,
        max_updates=UPDATES,
        kl_coef=0.0,
        entropy_coef=0.0,
        advantage="grpo",
        micro_batch_size=PROMPTS_PER_UPDATE * SAMPLES_PER_PROMPT,
    )
    assert settings.mini_batch_size == 4
    updater = PPOUpdater(settings, model)
    tokenizer = model.tokenizer

    def prompt(word: str) -> list[int]:
        content = f"The secret word is {word}. Reply with the secret word inside <answer> and </answer>."
        # An empty system message: without one the chat template adds SmolLM's own, 16 of the prompt's 50 tokens,
        # which every sampling and update pass would carry for nothing the test measures.
        ids = tokenizer.apply_chat_template(
            [{"role": "system", "content": ""}, {"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(ids)

    rng = random.Random(0)
    rewards = []
    for sampling in range(UPDATES + 1):
        words = [w for w in rng.sample(WORDS, PROMPTS_PER_UPDATE) for _ in range(SAMPLES_PER_PROMPT)]
        results = sample(model, [prompt(w) for w in words], max_new_tokens=10, seed=sampling)
        batch = []
        for i, ((sequence, logprobs, text), word) in enumerate(zip(results, words, strict=True)):
            batch.append(
                Sample(
                    f"{sampling}-{i}",
                    sequence,
                    answer_reward(text, [word]),
                    group_id=f"{sampling}-{i // SAMPLES_PER_PROMPT}",
                    behaviour_logprobs=logprobs,
                )
            )
        rewards.append(sum(x.score for x in batch) / len(batch))
        if sampling < UPDATES:
            updater.update(batch)
    print("mean reward per sampling:", [round(r, 3) for r in rewards])
    start, end = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert end > start + 0.15, f"mean reward per sampling: {[round(r, 3) for r in rewards]}"
