"""GPU memory the PPO trainer needs for Qwen2.5-0.5B and -7B, on paper (arithmetic, nothing is run).

    python bench/trainer/gpu_sizing.py [--tokens 8192]

Per GPU, for one sequence of ``--tokens`` per micro-batch, bf16 autocast, layer checkpointing and
1,024-position logit chunks (the trainer's defaults):
- LoRA, as built (``--num-workers N`` keeps a whole copy per GPU): the frozen fp32 base that the actor,
  the critic and the reference share, plus activations;
- full fine-tuning (RAG-R1's): actor and critic at 16 bytes a parameter (fp32 weights, gradients, AdamW's
  two moments) and a bf16 reference, divided over N GPUs as FSDP would shard it (FSDP is not built), plus
  activations and two gathered bf16 layers.
Activations: the hidden state at every layer boundary (bf16), one layer's recomputed activations, and
one logit chunk's float32 logits, softmax and gradient.
"""

from __future__ import annotations

import argparse

GIB = 2**30
# Parameters, layers, hidden size, MLP size, vocabulary (the models' config.json).
MODELS = {
    "Qwen2.5-0.5B": (0.494e9, 24, 896, 4864, 151936),
    "Qwen2.5-7B": (7.62e9, 28, 3584, 18944, 152064),
}
LOGIT_CHUNK = 1024
GPUS = (1, 2, 4, 8)


def activations(tokens: int, layers: int, hidden: int, mlp: int, vocab: int) -> float:
    boundaries = layers * tokens * hidden * 2
    one_layer = tokens * (4 * hidden + 3 * mlp) * 2
    logits = LOGIT_CHUNK * vocab * 4 * 3
    return boundaries + one_layer + logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the longest sequence")
    args = parser.parse_args()
    print(f"GiB per GPU, one {args.tokens}-token sequence per micro-batch")
    print("| model | activations | LoRA (built, a copy per GPU) | "
          + " | ".join(f"full fine-tune, {n} GPU{'s' if n > 1 else ''}" for n in GPUS) + " |")
    print("|---" * (3 + len(GPUS)) + "|")
    for name, (params, layers, hidden, mlp, vocab) in MODELS.items():
        act = activations(args.tokens, layers, hidden, mlp, vocab)
        lora = 4 * params + act
        states = 2 * 16 * params + 2 * params
        gathered = 2 * (params / layers) * 2
        full = [(states / n + act + gathered) / GIB for n in GPUS]
        print(f"| {name} | {act / GIB:.1f} | {lora / GIB:.1f} | " + " | ".join(f"{f:.1f}" for f in full) + " |")


if __name__ == "__main__":
    main()
