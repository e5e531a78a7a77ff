"""How an evaluation's questions are batched, against a running policy: each mode on its own in batches of the
first ``--batch-sizes`` (the baseline: how the demo and `ragr1 eval` batched before), then every mode's questions
in one sequence of batches (``evaluate.run_questions``) at each of ``--batch-sizes``, in the same run.

    ragr1 up --no-trainer &            # the stack; its endpoints in runs/<time>/endpoints.json
    python bench/demo/eval_batching.py --endpoints runs/<time>/endpoints.json --file runs/<demo>/data/eval.jsonl \
        [--checkpoint runs/<demo>/sft/checkpoints/v000001/policy] [--batch-sizes 32 64]

Greedy, as every evaluation. It prints each layout's seconds and ratio to the baseline, the multi-query EM, and
the share of the questions whose generated text equals the baseline's (a batch's composition may move a
float32 tie on a CPU engine; the scores are what a user compares).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragr1.model_paths import find_model
from ragr1.services.policy.client import PolicyClient
from ragr1.stack import evaluate
from ragr1.stack.cli import policy_target
from ragr1.stack.demo import EVAL_MODES
from ragr1.v1 import common_pb2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", default="", help="`ragr1 up`'s endpoints.json")
    parser.add_argument("--policy", default="", help="the policy's address, without --endpoints")
    parser.add_argument("--file", required=True, help="questions (JSONL, the layout of `ragr1 eval --file`)")
    parser.add_argument("--checkpoint", default="", help="weights to load first, as `ragr1 eval --checkpoint`")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64])
    args = parser.parse_args()
    target = policy_target(args.endpoints, args.policy)
    questions = evaluate.load_questions(args.file)
    with PolicyClient(target) as policy:
        if args.checkpoint:
            version = policy.weight_version().version + 1
            policy.update_weights(version, str(find_model(args.checkpoint, "checkpoint")))

        layouts = [(f"each mode alone, batches of {args.batch_sizes[0]}", [[m] for m in EVAL_MODES],
                    args.batch_sizes[0])]
        layouts += [(f"the modes together, batches of {b}", [list(EVAL_MODES)], b) for b in args.batch_sizes]
        baseline_seconds = 0.0
        baseline_text: dict[str, str] = {}
        print(f"{len(questions)} questions x {len(EVAL_MODES)} modes, greedy")
        for name, groups, batch_size in layouts:
            start = time.perf_counter()
            got: dict[str, common_pb2.Rollout] = {}
            for modes in groups:
                by_mode = evaluate.run_questions(policy.rollout, questions, modes, batch_size, run="bench")
                for rollouts, _ in by_mode.values():
                    got.update((r.task_id, r) for r in rollouts)
            seconds = time.perf_counter() - start
            text = {task: evaluate.rollout_record(r)["generated"] for task, r in got.items()}
            baseline_seconds = baseline_seconds or seconds
            baseline_text = baseline_text or text
            same = sum(text[t] == baseline_text.get(t) for t in text) / len(text)
            multi = [r.reward.exact_match for r in got.values() if r.mode == evaluate.MODES["multi"]]
            print(f"{name:36s} {seconds:7.1f} s  x{seconds / baseline_seconds:.2f}  multi-query EM "
                  f"{sum(multi) / len(multi):.3f}  text as the baseline's {same:.0%}", flush=True)


if __name__ == "__main__":
    main()
