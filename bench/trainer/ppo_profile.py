"""Where one PPO update's time goes: the phases of ``PPOUpdater.update`` (each timed to the device's end)
and the torch profiler's operators, on the GPU check's sequences and random-weight architectures
(``bench/gpu/sections.py``).

    python bench/trainer/ppo_profile.py --arch Qwen2.5-1.5B        # on a GPU (a lent machine runs it from the checkout)
    python bench/trainer/ppo_profile.py --device cpu --tiny        # the same on toy sizes

It prints one update's tokens/s at each of ``--micro-batch-tokens`` (the first is the baseline of the ratios;
the trainer's default 4,096 unless given), then, at the first, the phases' seconds and shares of the update,
the device's busy time against the update's wall time (the rest is the device waiting for the host), and the
operators with the most device time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import sections as gpu_sections

# The updater's methods whose time is a phase of the update (``step`` runs once per model and mini-batch).
PHASES = ("prepare", "_hold_previous_actor", "step", "_likelihood_change")


@contextlib.contextmanager
def phases(updater: Any, sync: Callable[[], None], seconds: dict[str, float]) -> Iterator[None]:
    """Times each phase method of ``updater`` (the step per model), waiting for the device at its end."""
    import torch

    originals = {name: getattr(updater, name) for name in PHASES}

    def timed(name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        key = f"step {args[0]}" if name == "step" else name
        sync()
        start = time.perf_counter()
        with torch.profiler.record_function(key):
            result = method(*args, **kwargs)
        sync()
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
        return result

    for name, method in originals.items():
        setattr(updater, name, functools.partial(timed, name, method))
    try:
        yield
    finally:
        for name in originals:
            delattr(updater, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="Qwen2.5-1.5B", choices=sorted(gpu_sections.ARCHS))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy sizes")
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning (default)")
    parser.add_argument("--rows", type=int, default=25, help="operators to list")
    parser.add_argument(
        "--micro-batch-tokens", type=int, nargs="+", default=None,
        help="PPO micro-batch sizes in tokens to time one update at (default: the trainer's)",
    )
    args = parser.parse_args()
    import torch

    ctx = gpu_sections.Context(
        args.device, gpu_sections.TINY_SIZES if args.tiny else gpu_sections.GPU_SIZES,
        Path(tempfile.mkdtemp(prefix="ragr1-ppo-profile-")),
    )
    from ragr1.services.trainer.updater import PPOUpdater

    settings = gpu_sections.ppo_settings(ctx, args.lora_rank)
    updater = PPOUpdater.build(settings, ctx.model_dir(args.arch))
    samples = gpu_sections.ppo_samples(ctx.sizes, gpu_sections.ARCHS[args.arch].vocab)
    sizes = args.micro_batch_tokens or [settings.micro_batch_tokens]
    baseline = 0.0
    for tokens in sizes:
        updater.settings = dataclasses.replace(settings, micro_batch_tokens=tokens)
        # The GPU check's timing: a warm-up update (kernels chosen for these shapes), then the timed ones.
        result = gpu_sections.measure(ctx, lambda: updater.update(samples))
        rate = result["rate"]
        baseline = baseline or rate
        print(f"{args.arch} on {args.device}, {tokens}-token micro-batches: one update {result['seconds']:.3f} s, "
              f"{rate:,.0f} tok/s, x{rate / baseline:.2f}")
    updater.settings = dataclasses.replace(settings, micro_batch_tokens=sizes[0])

    seconds: dict[str, float] = {}
    with phases(updater, ctx.sync, seconds):
        start = time.perf_counter()
        updater.update(samples)
        timed_wall = time.perf_counter() - start
    print(f"\nphases (each waited for; the update then took {timed_wall:.3f} s):")
    for key, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {key:24s} {value:8.3f} s  {value / timed_wall:6.1%}")
    print(f"  {'(the rest)':24s} {timed_wall - sum(seconds.values()):8.3f} s")

    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        updater.update(samples)
        ctx.sync()
        profiled = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    print(f"\nprofiled update {profiled:.3f} s; device busy {busy:.3f} s ({busy / profiled:.1%} of it)")
    sort = "self_cuda_time_total" if ctx.cuda else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
