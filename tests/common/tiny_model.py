"""Tiny randomly initialised models with SmolLM2's tokenizer and architecture (Llama), made at test time from the
shipped model's config: nothing downloaded, and the real code paths (vLLM's engine, the trainer's update) run in a
fraction of SmolLM2's arithmetic. For tests of plumbing (ids, masks, log-probs, versions, weight loads), not of what
a trained model writes: the whole-system tests keep SmolLM2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragr1.model_paths import prepare_policy_model

# The trainer's tests: as small as transformers builds it.
TRAINER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
# vLLM's CPU attention takes head sizes from 32 up. Weights drawn wider than SmolLM2's (initializer_range 0.02)
# make a random model's next-token distributions peaked, as a trained model's are, so that other weights move its
# log-probs well past the weight-sync alarm's threshold (its test reads that) and change its greedy tokens (the
# update tests).
# ``make_tiny_model(..., ends=True)`` gives it an end of sequence it samples now and then.
ENGINE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "initializer_range": 0.2,
}


# How far the end-of-sequence token's (tied) embedding reaches along the model's mean hidden state, in units of the
# embeddings' mean norm: far enough that most sampled answers end on their own within a turn's few dozen tokens,
# not so far that they end at their first token (then no turn would have a body to check).
EOS_REACH = 1.3


def make_tiny_model(target: Path, sizes: dict[str, Any] | None = None, seed: int = 0, ends: bool = False) -> Path:
    """A checkpoint in ``target`` (SmolLM2's config with ``sizes``, default ``TRAINER``, weights seeded).

    ``ends``: a random model almost never samples its end-of-sequence token among 49,152, so a generation would
    always run to its token limit; this points that token's output embedding along the mean of the model's final
    hidden states, which makes its logit high in every context, so that generations end by themselves at varied
    lengths, as the engine's stop handling needs to be seen doing."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = prepare_policy_model()
    config = AutoConfig.from_pretrained(source)
    config.update(TRAINER if sizes is None else sizes)
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if ends:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Which river flows through the capital of the country that won the cup?"}],
            add_generation_prompt=True, return_tensors="pt", return_dict=False,
        )
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states[-1][0]
            mean = hidden.mean(0)
            weight = model.get_output_embeddings().weight
            weight[tokenizer.eos_token_id] = EOS_REACH * mean / mean.norm() * weight.norm(dim=1).mean()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
