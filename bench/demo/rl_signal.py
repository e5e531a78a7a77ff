"""RL's signal at each sampling temperature: GRPO groups of one SFT checkpoint on the demo's RL prompts, and how
many of them have a spread (samples that scored differently): the only groups dynamic sampling trains on, so
the groups an update must sample to find its batch.

    python bench/demo/rl_signal.py --checkpoint runs/<time>/sft/checkpoints/v000001/policy \
        --questions runs/<time>/data/rl.jsonl [--temperatures 1.0,0.7] [--prompts 24] [--samples 4]

Starts the demo's stack (the default preset's settings: the reward it pays, the loop's budgets) with the
checkpoint as the policy, and sends the same prompts, in the mode RL trains in, as groups of ``--samples``
through ``Policy.Rollout`` at each temperature in turn. The baseline is the first temperature (1.0: Search-R1's,
RAG-R1's and DAPO's). Printed per temperature: groups with a spread, the mean reward, answers given, tokens
generated per sample, and the seconds the groups took; then each one's ratios to the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragr1.services.policy.client import PolicyClient
from ragr1.services.trainer.loop.groups import has_spread
from ragr1.stack import evaluate, wiring
from ragr1.stack.demo import demo_config
from ragr1.stack.local import start_stack
from ragr1.v1 import common_pb2


def measure(policy: PolicyClient, questions: list[evaluate.Question], temperature: float, samples: int,
            mode: str, batch: int) -> dict[str, float]:
    start = time.perf_counter()
    groups: dict[str, list[common_pb2.Rollout]] = defaultdict(list)
    sampling = common_pb2.SamplingParams(temperature=temperature)
    for i in range(0, len(questions), batch):
        tasks = []
        for q in questions[i:i + batch]:
            task = evaluate.to_task(q, mode, run=f"signal-t{temperature:g}")
            task.num_samples = samples
            tasks.append(task)
        for r in policy.rollout(tasks, sampling=sampling, timeout=1800):
            groups[r.task_id].append(r)
    seconds = time.perf_counter() - start
    rollouts = [r for members in groups.values() for r in members]
    return {
        "groups": len(groups),
        "spread": sum(has_spread([r.reward.total for r in members]) for members in groups.values()),
        "reward": sum(r.reward.total for r in rollouts) / len(rollouts),
        "answered": sum(bool(r.reward.extracted_answer) for r in rollouts) / len(rollouts),
        "tokens": sum(sum(r.loss_mask) for r in rollouts) / len(rollouts),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the SFT checkpoint (a demo run's sft/.../policy)")
    parser.add_argument("--questions", required=True, help="RL prompts: a demo run's data/rl.jsonl")
    parser.add_argument("--temperatures", default="1.0,0.7", help="comma-separated; the first is the baseline")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (a GRPO group)")
    parser.add_argument("--batch", type=int, default=8, help="prompts per Policy.Rollout call")
    args = parser.parse_args()
    temperatures = [float(t) for t in args.temperatures.split(",")]
    questions = evaluate.load_questions(Path(args.questions))[: args.prompts]
    with tempfile.TemporaryDirectory() as run:
        config = demo_config(run_dir=run)
        supervisor = start_stack(config, Path(run), model=Path(args.checkpoint))
        with supervisor, PolicyClient(f"{wiring.HOST}:{wiring.Ports.of(config).policy}") as policy:
            results = [measure(policy, questions, t, args.samples, config.ppo.mode, args.batch) for t in temperatures]
    print(f"\n{len(questions)} RL prompts x {args.samples} samples, mode {config.ppo.mode}, reward {config.reward}; "
          f"checkpoint {args.checkpoint}")
    print(f"{'temperature':>11} {'groups with a spread':>20} {'mean reward':>11} {'answered':>8} "
          f"{'tokens/sample':>13} {'seconds':>7}   ratios to {temperatures[0]:g}: spread, reward, seconds")
    base = results[0]
    for t, r in zip(temperatures, results, strict=True):
        ratios = [r["spread"] / max(1, base["spread"]), r["reward"] / max(1e-9, base["reward"]),
                  r["seconds"] / base["seconds"]]
        print(f"{t:>11g} {r['spread']:>9d} of {r['groups']:<8d} {r['reward']:>11.3f} {r['answered']:>8.2f} "
              f"{r['tokens']:>13.0f} {r['seconds']:>7.0f}   " + " ".join(f"x{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
