"""The trained networks: the checkpoint the policy loads computes what the trainer trained (LoRA merged),
log-probs are those of each row's sampling temperature, and the memory levers change no result."""

from __future__ import annotations

from pathlib import Path

import torch

from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.loop import to_sample
from ragr1.services.trainer.model import PolicyModel, collate, micro_batches
from ragr1.services.trainer.updater import PPOUpdater
from tests.trainer.rollouts import make_rollout, tiny_settings
from tests.trainer.rounding import rounding


def test_lora_update_saves_a_merged_checkpoint_that_matches_and_a_reference_that_did_not_move(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    updater = PPOUpdater.build(tiny_settings(lora_rank=4, actor_lr=5e-2, kl_coef=0.001), tiny_model_dir)
    model = updater.actor
    samples = [to_sample(make_rollout(f"r{i}", score=float(i % 2), seed=i)) for i in range(4)]
    for s in samples:
        s.behaviour_logprobs = None  # on-policy: the random ones would make every importance weight ~0
    batch = collate([s.sequence for s in samples], model.pad_id)
    before = model(batch).logprobs.detach()
    # Log-probs of the same weights computed another way differ by their rounding (tests/trainer/rounding.py).
    rounded = rounding(model.base().config.vocab_size, float(before.abs().max()))
    frozen = {k: v.clone() for k, v in model.lm.state_dict().items() if "lora_" not in k}
    updater.update(samples)
    after = model(batch).logprobs.detach()
    assert float((after - before).abs().max()) > rounded, "the LoRA update changed nothing"
    # The adapter switched off, or at zero before the update: the same weights.
    assert torch.allclose(model.reference_logprobs(batch), before, rtol=0, atol=rounded)
    model.save_policy(tmp_path / "ck")
    # Merging computed the served weights without touching the frozen ones (the critic shares them).
    for key, value in model.lm.state_dict().items():
        if "lora_" not in key:
            assert torch.equal(value, frozen[key]), key
    served = PolicyModel(tmp_path / "ck", bf16=False)
    # W + BA rounded once against W x + B (A x): the same weights, summed in another order.
    assert torch.allclose(served(batch).logprobs, after, rtol=0, atol=rounded)
    assert not any("lora" in key for key in served.lm.state_dict())


def test_trainer_state_restores_weights_optimisers_and_the_update_count(tiny_model_dir: Path) -> None:
    samples = [to_sample(make_rollout(f"r{i}", score=float(i % 2), seed=i)) for i in range(4)]
    settings = tiny_settings(actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.001, max_updates=10, actor_warmup_ratio=0.3)

    first = PPOUpdater.build(settings, tiny_model_dir)
    first.update(samples)
    state = first.state()
    second = PPOUpdater.build(settings, tiny_model_dir)
    second.load_state(state)
    a, b = first.update(samples), second.update(samples)
    assert a["actor_lr"] == b["actor_lr"] == 2 / 3 * 1e-3  # the second update of a 3-update warm-up
    for model in ("actor", "critic"):
        for (name, x), y in zip(first.state()[model].items(), second.state()[model].values(), strict=True):
            # The same arithmetic on the same state in one process: no rounding apart.
            assert torch.equal(x, y), name


def test_log_probs_divide_the_logits_by_each_rows_temperature(tiny_model_dir: Path) -> None:
    model = PolicyModel(tiny_model_dir, bf16=False)
    sequence = TokenSequence([5, 6, 7], [8, 9, 10, 11], [1, 1, 0, 1])
    batch = collate([sequence, sequence], model.pad_id, [1.0, 0.7])
    out = model(batch)
    with torch.no_grad():
        logits = model.lm(input_ids=batch.input_ids[:1]).logits[0, 2:6]
    for row, temperature in ((0, 1.0), (1, 0.7)):
        expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor([[8], [9], [10], [11]]))
        expected = expected.squeeze(-1) * batch.mask[row]
        # The whole logits against the generated positions' own: log-probs rounded apart. A wrong temperature
        # (0.7 against 1) moves them by a third of their size.
        rounded = rounding(model.base().config.vocab_size, float(expected.abs().max()))
        assert torch.allclose(out.logprobs[row], expected, rtol=0, atol=rounded), temperature
    # The inserted token is never scored: no log-prob, no entropy.
    assert out.logprobs[1, 2] == 0 and out.entropy[1, 2] == 0


def test_micro_batches_cap_rows_and_padded_tokens_longest_first() -> None:
    sequences = [TokenSequence([1] * n, [2] * 2, [1, 1]) for n in (3, 10, 5, 4)]  # lengths 5, 12, 7, 6
    batch = collate(sequences, 0)
    assert micro_batches(batch, range(4), max_rows=4, max_tokens=0) == [[1, 2, 3, 0]]
    assert micro_batches(batch, range(4), max_rows=2, max_tokens=0) == [[1, 2], [3, 0]]
    # 12 tokens alone; then 7 + 7 fits 14, a third row of 7 would make 21.
    assert micro_batches(batch, range(4), max_rows=4, max_tokens=14) == [[1], [2, 3], [0]]
    assert micro_batches(batch, range(4), max_rows=4, max_tokens=5) == [[1], [2], [3], [0]]
    assert batch.select([2, 0]).input_ids.shape == (2, 7)  # padding beyond the longest row cut off


def test_chunked_scoring_and_token_capped_micro_batches_give_the_same_gradients(tiny_model_dir: Path) -> None:
    samples = [
        to_sample(make_rollout(f"r{i}", score=float(i % 3), seed=i, generated=4 + 3 * i, temperature=0.8))
        for i in range(4)
    ]
    for s in samples:
        s.behaviour_logprobs = None
    results = []
    for chunk, tokens, checkpointing in ((4096, 0, False), (3, 40, True)):
        settings = tiny_settings(
            micro_batch_size=4, logit_chunk_tokens=chunk, micro_batch_tokens=tokens,
            gradient_checkpointing=checkpointing, kl_coef=0.001, kl_penalty="loss",
        )
        updater = PPOUpdater.build(settings, tiny_model_dir)
        prepared = updater.prepare(samples)
        stats = updater.step("critic", prepared, range(4))
        updater.step("actor", prepared, range(4), stats=stats)
        grads = {
            f"{part.name} {i}": p.grad.clone()
            for part in updater.parts
            for i, p in enumerate(part.params)
            if p.grad is not None
        }
        results.append((stats.result(), grads, prepared.advantages, float(prepared.old_logprobs.abs().max())))
    (plain, plain_grads, plain_adv, logprob), (lean, lean_grads, lean_adv, _) = results
    # Advantages come from the scores and the critic's values, exactly 0 before its first step (its head starts
    # at zero): the same in both runs.
    assert torch.equal(plain_adv, lean_adv)
    # The rest is the same arithmetic summed in other orders (chunks, micro-batches, recomputation): as far apart
    # as the rounding of the terms each value comes from (tests/trainer/rounding.py).
    vocabulary = updater.actor.base().config.vocab_size
    scales = {
        # Of log-probs; -min(r A, clip(r) A) moves by |A| r times the log-probs' rounding; exp(d) by exp(d) times.
        "policy_loss": float(plain_adv.abs().max()) * plain["ratio_max"] * logprob, "entropy": logprob,
        "kl_loss": logprob, "ratio_max": plain["ratio_max"] * logprob,
        # (v - R)^2 >= 0: its terms add up to the loss itself.
        "value_loss": plain["value_loss"],
    }
    for key, scale in scales.items():
        assert abs(plain[key] - lean[key]) <= rounding(vocabulary, scale), key
    assert plain_grads.keys() == lean_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        # Entries are sums over tokens of products the tensor's largest entry bounds, not each entry's own size
        # (some cancel to near 0).
        assert float((grad - lean_grads[name]).abs().max()) <= rounding(vocabulary, float(grad.abs().max())), name
