"""The trainer on the AVX2 machine class, emulated on a CPU with AVX-512: SFT and PPO tokens/s in float32 with
torch's kernels capped at AVX2 (``ATEN_CPU_CAPABILITY=avx2`` for ATen's, ``ONEDNN_MAX_CPU_ISA=AVX2`` for
oneDNN's matmuls), against the same CPU uncapped in float32 and, where it multiplies bfloat16 in hardware, in
bfloat16 (what the trainer picks there). Each is a process of ``bench/trainer/throughput.py`` (the capability is
read when torch loads), taken in turn A B C A B C, so that a slow minute of the machine falls on all of them.

    python bench/trainer/isa.py [--repeats 2] [--sequences 8] [--steps 2]

Read the ratios, not the tokens/s: a real AVX2 host differs in clock, cache and memory too. What the cap leaves
out: vLLM's engine and the retriever's ONNX encoder keep their own kernels, so this says what the AVX2 class
costs the training phases (SFT, the PPO update), not a whole demo.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from bench.common import header
from bench.trainer.throughput import VARIANTS
from ragr1.services.trainer.model import native_bf16

THROUGHPUT = Path(__file__).with_name("throughput.py")
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# name -> (throughput.py's variant, environment added); the first is the baseline.
CONFIGS: dict[str, tuple[str, Mapping[str, str]]] = {
    "fp32, this CPU": ("fp32 full", {}),
    "fp32, AVX2 kernels": ("fp32 full", AVX2),
    "bf16, this CPU": ("bf16 full", {}),
}
def run(variant: str, env: Mapping[str, str], args: argparse.Namespace) -> dict[str, float]:
    """``{"sft": tokens/s, "ppo": tokens/s}`` of one throughput.py process of ``variant`` under ``env``."""
    with tempfile.TemporaryDirectory() as out:
        written = Path(out) / "rates.json"
        command = [sys.executable, str(THROUGHPUT), "--variants", variant, "--no-queue", "--sequences",
                   str(args.sequences), "--steps", str(args.steps), "--json", str(written)]
        result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
        if result.returncode or not written.exists():
            raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
        rates = json.loads(written.read_text())
    return {stage: rates[stage][variant] for stage in ("sft", "ppo")}


def table(measured: Mapping[str, Sequence[dict[str, float]]]) -> list[str]:
    """One row a configuration: the median tokens/s of SFT and PPO and each as a ratio of the first row's."""
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in ("sft", "ppo")}
               for name, runs in measured.items()}
    base = next(iter(medians.values()))
    rows = [f"{'':20s} {'SFT tokens/s':>13s} {'ratio':>6s} {'PPO tokens/s':>13s} {'ratio':>6s}  runs"]
    for name, m in medians.items():
        rows.append(f"{name:20s} {m['sft']:13.1f} {m['sft'] / base['sft']:6.2f} {m['ppo']:13.1f} "
                    f"{m['ppo'] / base['ppo']:6.2f}  {len(measured[name])}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration, taken in turn")
    parser.add_argument("--sequences", type=int, default=8, help="throughput.py's --sequences")
    parser.add_argument("--steps", type=int, default=2, help="throughput.py's timed steps a variant")
    args = parser.parse_args()
    print(header())
    bf16 = native_bf16(torch.device("cpu"))
    configs = {name: c for name, c in CONFIGS.items() if bf16 or not VARIANTS[c[0]][0]}  # [0]: its bf16 flag
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name, (variant, env) in configs.items():
            got = run(variant, env, args)
            measured[name].append(got)
            print(f"  run {repeat + 1}, {name}: SFT {got['sft']:.1f}, PPO {got['ppo']:.1f} tokens/s", flush=True)
    print("\n".join(table(measured)))


if __name__ == "__main__":
    main()
