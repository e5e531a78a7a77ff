"""Demo runs side by side, from their report.json alone (no service needed): the reward each paid, its RL stage's
dynamic sampling (groups trained, groups sampled to find them, the share whose samples differed) and, where the
run evaluated its more held-out questions, the SFT -> RL gain there and how many answers carry a qualifier in
parentheses before and after RL (seeds learnt them under F1 and under exact match), beside how many of its SFT
questions search a title with Wikipedia's disambiguation, where the habit starts:

    python bench/demo/runs.py --run runs/<demo-1> --run runs/<demo-2> ...

The groups' shares are pooled per reward at the end. Runs from before ``gain_questions`` have no more held-out
answers: `bench/demo/held_out_gain.py` evaluates their checkpoints on those questions and prints the same counts.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def qualified(records: list[dict[str, Any]]) -> int:
    """Answers with a parenthesis: a qualifier such as "Stone (city)", often a search copied into the answer."""
    return sum("(" in r["answer"] for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, action="append", required=True, help="a demo's run directory")
    args = parser.parse_args()
    pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for run in args.run:
        report: dict[str, Any] = json.loads((run / "report.json").read_text())
        config, steps = report["config"], report["rl_steps"]
        trained = sum(s["groups_trained"] for s in steps)
        sampled = sum(s["groups_sampled"] for s in steps)
        pooled[config["reward"]][0] += trained
        pooled[config["reward"]][1] += sampled
        print(f"\n{run}: reward {config['reward']}, seeds sft {config['sft']['seed']} ppo {config['ppo']['seed']}")
        per_update = " ".join(f"{s['groups_trained']}/{s['groups_sampled']}" for s in steps)
        print(f"  groups trained / sampled per update: {per_update} (all: {trained} of {sampled}, "
              f"{trained / sampled:.0%})")
        gain = report.get("held_out_gain")
        if gain:
            em = gain["exact_match"]
            print(f"  SFT -> RL on {gain['questions']} more held-out questions ({gain['mode']}): EM "
                  f"{em['sft']['mean']:.3f} -> {em['rl']['mean']:.3f}, gain {em['gain']['mean']:+.3f} "
                  f"[{em['gain']['low']:.2f}, {em['gain']['high']:.2f}]")
            records = report["gain_rollouts"]
            print(f"  answers with a parenthesis: SFT {qualified(records['sft'])}, RL {qualified(records['rl'])} "
                  f"of {len(records['rl'])}")
        train = run / "data" / "train.jsonl"
        if train.exists():
            questions = [json.loads(line) for line in train.read_text().splitlines() if line.strip()]
            titled = sum(any(t.rstrip().endswith(")") for t in q.get("supporting_titles", [])) for q in questions)
            print(f"  SFT questions searching a disambiguated title: {titled} of {len(questions)}")
    for reward, (trained, sampled) in pooled.items():
        print(f"\n{reward}: {trained} of {sampled} groups sampled differed ({trained / sampled:.0%})")


if __name__ == "__main__":
    main()
