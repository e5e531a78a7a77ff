"""Peak resident memory of one PPO update of SmolLM2-135M, per trainer configuration.

Each configuration runs in a fresh child process (peak RSS as the kernel counts it, getrusage) on the
same realistic batch: 16 multi-turn rollouts of 1,500-2,000 tokens (a real HotpotQA prompt, then
turns of generated text and inserted ``<information>`` blocks, about half of the response masked),
scored, with behaviour log-probs. The parent watches each child's RSS and stops it above
``--limit-gib`` (reported as "> limit"), so that the baseline cannot take the machine down.

Configurations: the defaults of ``ragr1 train ppo`` (LoRA r16, token-capped micro-batches, chunked
vocabulary projection, gradient checkpointing), the defaults with every weight trained (``lora_rank
0``), and the old setting as the baseline: full fine-tuning, micro-batches of 4 rows with no token cap,
the vocabulary projection in one piece, no gradient checkpointing, one optimiser step per batch.

    python bench/trainer/memory.py [--rollouts 16] [--limit-gib 16] [--only defaults,old]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGURATIONS: dict[str, dict[str, object]] = {
    "defaults (LoRA r16)": {},
    "defaults, full fine-tune": {"lora_rank": 0},
    "defaults, no gradient checkpointing": {"gradient_checkpointing": False},
    "old (baseline)": {
        "lora_rank": 0,
        "micro_batch_size": 4,
        "micro_batch_tokens": 0,
        "logit_chunk_tokens": 1 << 30,
        "gradient_checkpointing": False,
        "mini_batch_size": 16,
    },
}
BASELINE = "old (baseline)"
# The parent stops a child when the machine has less than this left.
MIN_AVAILABLE_GIB = 0.75


def rss_gib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except FileNotFoundError:
        pass
    return 0.0


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def realistic_samples(tokenizer: object, count: int, seed: int = 0) -> list[object]:
    """``count`` rollouts of 1,500-2,000 tokens: generated turns (180-380 tokens) alternating with inserted
    information blocks (3 queries x ~100 tokens), until the length is reached; about half masked."""
    from ragr1.protocol.prompts import Mode
    from ragr1.services.trainer import data
    from ragr1.services.trainer.updater import Sample
    from ragr1.shipped import train_path

    rng = random.Random(seed)
    tasks = data.load_qa_tasks(train_path("hotpotqa"), "multi", limit=count)
    out = []
    for i, task in enumerate(tasks):
        prompt = data.render_prompt_ids(tokenizer, task.question, Mode.MULTI)  # type: ignore[arg-type]
        total = rng.randint(1500, 2000) - len(prompt)
        mask: list[int] = []
        while len(mask) < total:
            mask += [1] * rng.randint(180, 380)
            if len(mask) < total - 100:
                mask += [0] * rng.randint(250, 330)
        mask = mask[:total]
        mask[-1] = 1
        response = [rng.randrange(100, 40000) for _ in mask]
        out.append(
            Sample(
                f"m{i}",
                data.TokenSequence(prompt, response, mask),
                float(i % 2),
                group_id=f"g{i // 2}",
                behaviour_logprobs=[-rng.uniform(0.1, 3.0) if m else 0.0 for m in mask],
                temperature=1.0,
            )
        )
    return out


def child(name: str, rollouts: int) -> None:
    import torch

    from ragr1.model_paths import prepare_policy_model
    from ragr1.services.trainer.config import PPOConfig
    from ragr1.services.trainer.updater import PPOUpdater

    torch.manual_seed(0)
    config = dataclasses.replace(PPOConfig(batch_size=rollouts), **CONFIGURATIONS[name])  # type: ignore[arg-type]
    # The old setting took one step per batch, whatever its size.
    if name == BASELINE:
        config = dataclasses.replace(config, mini_batch_size=min(config.mini_batch_size, rollouts))
    updater = PPOUpdater.build(config, prepare_policy_model())
    loaded = peak_gib()
    samples = realistic_samples(updater.actor.tokenizer, rollouts)
    start = time.perf_counter()
    stats = updater.update(samples)  # type: ignore[arg-type]
    tokens = [len(s.sequence.prompt_ids) + len(s.sequence.response_ids) for s in samples]  # type: ignore[attr-defined]
    masked = sum(s.sequence.loss_mask.count(0) for s in samples)  # type: ignore[attr-defined]
    response = sum(len(s.sequence.response_ids) for s in samples)  # type: ignore[attr-defined]
    print(
        json.dumps(
            {
                "loaded_gib": loaded,
                "peak_gib": peak_gib(),
                "seconds": time.perf_counter() - start,
                "tokens_mean": sum(tokens) / len(tokens),
                "masked_share": masked / response,
                "actor_steps": stats["actor_steps"],
            }
        )
    )


def run(name: str, rollouts: int, limit_gib: float) -> dict[str, object]:
    command = [sys.executable, __file__, "--child", name, "--rollouts", str(rollouts)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = 0.0
    while proc.poll() is None:
        watched = max(watched, rss_gib(proc.pid))
        # A shared machine: stop before the kernel has to kill anything (ours or another process).
        if watched > limit_gib or available_gib() < MIN_AVAILABLE_GIB:
            proc.kill()
            proc.wait()
            return {"peak_gib": None, "watched_gib": watched, "low_memory": watched <= limit_gib}
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts per update (the default batch)")
    parser.add_argument("--limit-gib", type=float, default=16.0, help="stop a configuration above this RSS")
    parser.add_argument("--only", default="", help="comma-separated prefixes of configuration names")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rollouts)
        return
    wanted = [n for n in CONFIGURATIONS if not args.only or any(n.startswith(p) for p in args.only.split(","))]
    results = {}
    for name in wanted:
        results[name] = run(name, args.rollouts, args.limit_gib)
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    first = next((r for r in results.values() if r.get("tokens_mean")), None)
    if first is None:
        print(json.dumps(results))
        return
    print(
        f"\nOne PPO update of SmolLM2-135M: {args.rollouts} rollouts of {first['tokens_mean']:.0f} tokens on "
        f"average, {100 * float(first['masked_share']):.0f}% of the response masked (information)\n"  # type: ignore[arg-type]
    )
    base = results.get(BASELINE, {}).get("peak_gib")
    print("| configuration | peak RSS (GiB) | after loading (GiB) | update (s) | peak / baseline |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        if r["peak_gib"] is None:
            why = "machine low on memory" if r.get("low_memory") else "limit"
            print(f"| {name} | > {float(r['watched_gib']):.1f} (stopped: {why}) | | | |")  # type: ignore[arg-type]
            continue
        ratio = f"{float(r['peak_gib']) / float(base):.2f}" if base else "n/a"  # type: ignore[arg-type]
        print(
            f"| {name} | {float(r['peak_gib']):.2f} | {float(r['loaded_gib']):.2f} | "  # type: ignore[arg-type]
            f"{float(r['seconds']):.0f} | {ratio} |"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    main()
