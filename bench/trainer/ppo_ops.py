"""How many operators one PPO update dispatches per token, beside the SFT step on the same tokens, by name.

    python bench/trainer/ppo_ops.py                         # Qwen2.5-1.5B's layers on the CPU (a few minutes, ~5 GiB)
    python bench/trainer/ppo_ops.py --tiny                  # toy sizes (seconds)

The GPU check's trainer rows (``bench/gpu/sections.py``: 8 sequences of 512 prompt and 1,536 response tokens, a
quarter of the response generated, PPO in 2 mini-batches of 4 with the trainer's defaults, a critic and a KL
reference, bf16 autocast, layer checkpointing; the SFT step in micro-batches of 4 sequences), with every length
divided by ``--scale`` (default 8): the sequences and the trainer's token-sized settings (the PPO micro-batch's
token cap, the logit chunk), so that every micro-batch holds the rows and the logit chunks it holds at the
GPU check's sizes and the same operators run, on an eighth of the tokens.

The architecture's widths are the real ones; its vocabulary is ``--vocab`` (default 16,384; the count does
not depend on it) and its depth each of ``--layers`` (default 1 and 2: one full update and one SFT step fit in
~5 GiB at 1.5B's widths). A layer is the same operators every time, so two depths give the count per layer
and the rest, and with them the count at the real depth (28 layers for Qwen2.5-1.5B), printed as well.
Operators are counted by ``bench/trainer/opcount.py`` in the second update and step (the first allocates AdamW's
state). Per token is per token of the batch (prompts and responses, as the trainer's tokens/s counts them).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import sections as gpu_sections  # noqa: E402  (after the path: this file runs as a script)
from bench.trainer.opcount import Counts, Phase, count_operators, table  # noqa: E402


@dataclasses.dataclass
class Counted:
    layers: int
    tokens: float
    ppo: Counts
    sft: Counts


def sizes_for(tiny: bool, scale: int) -> gpu_sections.Sizes:
    if tiny:
        return gpu_sections.TINY_SIZES
    s = gpu_sections.GPU_SIZES
    return dataclasses.replace(s, prompt_tokens=s.prompt_tokens // scale, response_tokens=s.response_tokens // scale)


def ppo_settings(ctx: gpu_sections.Context, scale: int) -> Any:
    """The GPU check's PPO settings with bf16 autocast on whatever the device (as on a GPU) and the token-sized
    settings divided by ``scale``."""
    settings = dataclasses.replace(gpu_sections.ppo_settings(ctx, 0), bf16=True)
    return dataclasses.replace(
        settings,
        micro_batch_tokens=max(1, settings.micro_batch_tokens // scale),
        logit_chunk_tokens=max(1, settings.logit_chunk_tokens // scale),
    )


def ppo_count(ctx: gpu_sections.Context, arch: str, scale: int) -> Counts:
    import torch

    from ragr1.services.trainer.updater import PPOUpdater

    samples = gpu_sections.ppo_samples(ctx.sizes, gpu_sections.ARCHS[arch].vocab)
    updater = PPOUpdater.build(ppo_settings(ctx, scale), ctx.model_dir(arch))
    updater.update(samples)
    wrapped = [
        Phase(updater, "prepare", "prepare (no-gradient passes)"),
        Phase(updater, "_hold_previous_actor", "previous actor held"),
        Phase(updater, "step", lambda model, *args, **kwargs: f"{model} steps (passes)"),
        Phase(torch.nn.utils, "clip_grad_norm_", "gradient clipping"),
        Phase(updater.actor, "clip_gradients", "gradient clipping"),
        Phase(updater.critic, "clip_gradients", "gradient clipping"),
        *(Phase(part.optimizer, "step", f"{part.name} optimiser") for part in updater.parts),
        Phase(updater, "_likelihood_change", "likelihood check"),
    ]
    return count_operators(lambda: updater.update(samples), wrapped)


def sft_count(ctx: gpu_sections.Context, arch: str, scale: int) -> Counts:
    import torch

    from ragr1.services.trainer.config import SFTConfig
    from ragr1.services.trainer.sft import SFTTrainer

    s = ctx.sizes
    config = SFTConfig(
        model=str(ctx.model_dir(arch)), lora_rank=0, device=ctx.device_name, bf16=True,
        gradient_checkpointing=True, batch_size=s.sequences, micro_batch_size=s.micro_batch,
    )
    trainer = SFTTrainer(config)
    trainer.model.logit_chunk_tokens = max(1, trainer.model.logit_chunk_tokens // scale)
    sequences = gpu_sections.token_sequences(s, gpu_sections.ARCHS[arch].vocab)
    trainer.step(sequences)
    wrapped = [
        Phase(trainer, "step", "SFT step (passes)"),
        Phase(torch.nn.utils, "clip_grad_norm_", "gradient clipping"),
        Phase(trainer.model, "clip_gradients", "gradient clipping"),
        Phase(trainer.optimizer, "step", "optimiser"),
    ]
    return count_operators(lambda: trainer.step(sequences), wrapped)


def count_at(ctx: gpu_sections.Context, arch: str, scale: int) -> Counted:
    """One PPO update's and one SFT step's operators on ``arch`` (full fine-tuning), one model at a time."""
    s = ctx.sizes
    tokens = float(s.sequences * (s.prompt_tokens + s.response_tokens))
    ppo = ppo_count(ctx, arch, scale)
    gc.collect()
    sft = sft_count(ctx, arch, scale)
    gc.collect()
    return Counted(gpu_sections.ARCHS[arch].layers, tokens, ppo, sft)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="Qwen2.5-1.5B", choices=sorted(gpu_sections.ARCHS))
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2], help="depths to count at (two or more)")
    parser.add_argument("--vocab", type=int, default=16384, help="vocabulary size (0: the architecture's)")
    parser.add_argument(
        "--widths", choices=("real", "narrow"), default="real",
        help="narrow: hidden and intermediate sizes / 16, the heads kept (the same operators, ~1000x fewer FLOPs)",
    )
    parser.add_argument("--scale", type=int, default=8, help="divide the GPU check's lengths by this")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (the test), --arch tiny-qwen2 by default")
    parser.add_argument("--rows", type=int, default=20, help="operators to list by name")
    args = parser.parse_args(argv)
    if len(set(args.layers)) < 2:
        parser.error("--layers: give two depths or more (the count per layer is their difference)")
    arch = "tiny-qwen2" if args.tiny and args.arch == parser.get_default("arch") else args.arch
    real = gpu_sections.ARCHS[arch]
    scale = 1 if args.tiny else args.scale
    workdir = Path(tempfile.mkdtemp(prefix="ragr1-ppo-ops-"))
    ctx = gpu_sections.Context(args.device, sizes_for(args.tiny, scale), workdir)
    import torch

    if ctx.sizes.threads:
        torch.set_num_threads(ctx.sizes.threads)
    shape = real if args.widths == "real" else dataclasses.replace(
        real, hidden=real.hidden // 16 // real.heads * real.heads, intermediate=real.intermediate // 16
    )
    vocab = args.vocab or real.vocab
    s = ctx.sizes
    print(f"{arch} ({args.widths} widths: hidden {shape.hidden}, intermediate {shape.intermediate}, "
          f"{shape.heads} heads, {shape.kv_heads} KV heads), vocabulary {vocab}, on {args.device}; "
          f"{s.sequences} sequences of {s.prompt_tokens} + {s.response_tokens} tokens (the GPU check's / {scale}); "
          f"torch {torch.__version__}",
          flush=True)
    counted = []
    for layers in sorted(set(args.layers)):
        name = f"{arch}-{layers}L-v{vocab}-{args.widths}"
        gpu_sections.ARCHS[name] = dataclasses.replace(shape, layers=layers, vocab=vocab)
        c = count_at(ctx, name, scale)
        counted.append(c)
        print(f"{layers:3d} layers: PPO update {c.ppo.total:8,d} operators, {c.ppo.total / c.tokens:7.2f} per token; "
              f"SFT step {c.sft.total:8,d}, {c.sft.total / c.tokens:7.2f} per token; "
              f"PPO / SFT {c.ppo.total / c.sft.total:.2f}", flush=True)
    first, last = counted[0], counted[-1]
    per_layer_ppo = (last.ppo.total - first.ppo.total) / (last.layers - first.layers)
    per_layer_sft = (last.sft.total - first.sft.total) / (last.layers - first.layers)
    ppo_real = first.ppo.total + per_layer_ppo * (real.layers - first.layers)
    sft_real = first.sft.total + per_layer_sft * (real.layers - first.layers)
    tokens = first.tokens
    print(f"per layer: PPO update {per_layer_ppo:,.0f}, SFT step {per_layer_sft:,.0f}; at {real.layers} layers "
          f"(by the same difference): PPO update {ppo_real:,.0f} operators, {ppo_real / tokens:.2f} per token; "
          f"SFT step {sft_real:,.0f}, {sft_real / tokens:.2f} per token; PPO / SFT {ppo_real / sft_real:.2f}")
    columns = {"PPO update": (first.ppo, last.ppo), "SFT step": (first.sft, last.sft)}
    for what, key in (("phase", "by_phase"), ("name", "by_name")):
        at_depth = {
            name: extrapolate(getattr(a, key), getattr(b, key), first.layers, last.layers, real.layers)
            for name, (a, b) in columns.items()
        }
        print(f"\noperators per token at {real.layers} layers (by the same difference), by {what}:")
        print(table(at_depth, tokens, args.rows, "phase" if what == "phase" else "operator"))


def extrapolate(
    low: collections.Counter[str], high: collections.Counter[str], low_layers: int, high_layers: int, layers: int
) -> collections.Counter[str]:
    """Each key's count at ``layers`` from its counts at two depths (a layer adds the same operators each time)."""
    out: collections.Counter[str] = collections.Counter()
    for key in set(low) | set(high):
        per_layer = (high[key] - low[key]) / (high_layers - low_layers)
        out[key] = round(low[key] + per_layer * (layers - low_layers))
    return out


if __name__ == "__main__":
    main()
