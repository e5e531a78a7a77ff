"""What the likelihood-displacement check costs: the extra no-gradient forward pass over the rollouts an
update reinforced (positive advantage), against the rest of the same update, for SmolLM2-135M with the
trainer's default settings (LoRA r16, bf16 autocast, gradient checkpointing), under GAE (critic, KL in
the reward) and GRPO (no critic, KL in the loss). ``--fp32`` turns the autocast off, for CPUs without
bfloat16 instructions (where the autocast is emulated and slow).

The baseline is the update itself, measured in the same run: each update reports its total time and
the check's time (``likelihood_check_seconds``), and the ratio is check / (update - check).

    python bench/trainer/likelihood_check.py [--sequences 8] [--response-tokens 128] [--steps 3] [--fp32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from bench.trainer.throughput import rollout_samples
from ragr1.model_paths import prepare_policy_model
from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.model import PolicyModel
from ragr1.services.trainer.updater import PPOUpdater, Sample

VARIANTS = {"GAE (PPO defaults)": {}, "GRPO": {"advantage": "grpo"}}


def measure(
    model_dir: Path, samples: list[Sample], overrides: dict[str, str], steps: int, bf16: bool
) -> list[dict[str, float]]:
    settings = PPOSettings(actor_warmup_ratio=0.0, bf16=bf16, **overrides)  # type: ignore[arg-type]
    updater = PPOUpdater.build(settings, model_dir)
    updater.update(samples[:2])  # warm-up
    return [updater.update(samples) for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fp32", action="store_true", help="no bfloat16 autocast")
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = prepare_policy_model()
    tokenizer = PolicyModel(model_dir).tokenizer
    samples = rollout_samples(tokenizer, args.sequences, args.response_tokens)
    for i, sample in enumerate(samples):
        sample.group_id = f"g{i // 2}"  # GRPO pairs: one scored 0, one 1
    tokens = sum(len(s.sequence.prompt_ids) + len(s.sequence.response_ids) for s in samples)
    print(f"{args.sequences} rollouts, {tokens} tokens, {torch.get_num_threads()} torch threads, "
          f"{'float32' if args.fp32 else 'bfloat16 autocast'}")
    for name, overrides in VARIANTS.items():
        results = measure(model_dir, samples, overrides, args.steps, not args.fp32)
        ratios = [r["likelihood_check_seconds"] / (r["update_seconds"] - r["likelihood_check_seconds"])
                  for r in results]
        print(
            f"{name}: update {statistics.median(r['update_seconds'] for r in results):.1f} s, check "
            f"{statistics.median(r['likelihood_check_seconds'] for r in results):.2f} s over "
            f"{results[0]['likelihood_rollouts']:.0f} reinforced rollouts; check / rest of the update: "
            f"median {statistics.median(ratios):.3f} (per update: {', '.join(f'{x:.3f}' for x in ratios)})"
        )


if __name__ == "__main__":
    main()
