"""What one demo-sized PPO update costs on the CPU with and without its optional passes: activation
checkpointing (a second forward in the backward) and the KL reference (a no-gradient forward in ``prepare``),
each against the trainer's defaults, measured in the same run.

    python bench/trainer/ppo_update_passes.py [--rollouts 8] [--response-tokens 180] [--threads 1] [--repeats 2]

The update is the demo's (``ragr1/stack/presets/default.yaml``): SmolLM2-135M with LoRA r16, GRPO, mini-batches
of 4 rollouts in micro-batches of 2, on real prompts with a response a third of which is masked (retrieved)
tokens, on the stack's trainer threads (one beside the engine on two cores). It prints each variant's seconds per
update, its ratio to the defaults, and the seconds of its phases (``prepare``: the no-gradient passes; ``step``:
the optimiser steps; the likelihood check).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from transformers import AutoTokenizer

from bench.trainer import ppo_profile
from bench.trainer import throughput as trainer_throughput
from ragr1.model_paths import prepare_policy_model
from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.updater import PPOUpdater, Sample

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults (checkpointing, KL reference)": {},
    "no checkpointing": {"gradient_checkpointing": False},
    "no KL reference": {"kl_coef": 0.0},
    "neither": {"gradient_checkpointing": False, "kl_coef": 0.0},
}


def timed_update(updater: PPOUpdater, samples: list[Sample]) -> tuple[float, dict[str, float]]:
    """One update's wall seconds and its phases' seconds (``ppo_profile.phases``)."""
    seconds: dict[str, float] = {}
    with ppo_profile.phases(updater, lambda: None, seconds):
        start = time.perf_counter()
        updater.update(samples)
        return time.perf_counter() - start, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per update (the demo's batch)")
    parser.add_argument("--response-tokens", type=int, default=180, help="response length of each rollout")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant (the fastest counts)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = prepare_policy_model()
    shipped = PPOSettings(advantage="grpo", micro_batch_size=2)
    samples = trainer_throughput.rollout_samples(
        AutoTokenizer.from_pretrained(str(model_dir)), args.rollouts, args.response_tokens
    )
    for i, sample in enumerate(samples):
        sample.group_id = f"g{i // 4}"
    tokens = sum(len(s.sequence.prompt_ids) + len(s.sequence.response_ids) for s in samples)
    print(f"{args.rollouts} rollouts, {tokens} tokens, {args.threads} thread(s), best of {args.repeats}")
    baseline = 0.0
    for name, change in VARIANTS.items():
        torch.manual_seed(0)
        updater = PPOUpdater.build(dataclasses.replace(shipped, **change), model_dir)
        runs = [timed_update(updater, samples) for _ in range(args.repeats)]
        wall, phases = min(runs, key=lambda run: run[0])
        baseline = baseline or wall
        parts = ", ".join(f"{phase.strip('_')} {seconds:.1f} s" for phase, seconds in phases.items())
        print(f"{name:40s} {wall:7.1f} s  x{wall / baseline:.2f}  ({parts})")


if __name__ == "__main__":
    main()
