"""Earlier demo runs' SFT and final RL checkpoints on the questions their demo now evaluates as ``gain_questions``
(the next ones of each source after RL's, which no stage of the run saw), against a running policy:

    ragr1 up --no-trainer --max-model-len 4096 --max-tokens-per-turn 192 --tokens-per-query 160 &
    python bench/demo/held_out_gain.py --endpoints runs/<up>/endpoints.json --run runs/<demo-1> --run runs/<demo-2>

Each run's split is rebuilt from its report.json (its sources and question counts), so the questions are the ones
that run's demo would evaluate. Greedy; each checkpoint in the mode RL trained (``ppo.mode``) and without
retrieval; prints EM per stage, the paired SFT -> RL gains with 95% bootstrap intervals (``ragr1.stack.gains``)
and the answers with a parenthesis (``bench/demo/runs.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.demo.runs import qualified
from ragr1.model_paths import find_model
from ragr1.services.policy.client import PolicyClient
from ragr1.stack import evaluate, stats
from ragr1.stack.cli import policy_target
from ragr1.stack.gains import StageResult, held_out_gain
from ragr1.stack.questions import split_questions, write_jsonl


def checkpoints(run: Path) -> tuple[Path, Path]:
    """The run's SFT checkpoint and its last RL one."""
    rl = sorted((run / "rl" / "checkpoints").glob("v*"))
    if not rl:
        raise SystemExit(f"{run}: no RL checkpoint under rl/checkpoints")
    return run / "sft" / "checkpoints" / "v000001" / "policy", rl[-1] / "policy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", required=True, help="`ragr1 up`'s endpoints.json")
    parser.add_argument("--run", type=Path, action="append", required=True, help="a demo's run directory")
    parser.add_argument("--questions", type=int, default=60, help="questions per source (the default preset's)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    target = policy_target(args.endpoints, "")
    with PolicyClient(target) as policy, tempfile.TemporaryDirectory() as tmp:
        version = policy.weight_version().version

        def evaluated(checkpoint: Path, stage: str, questions: list[evaluate.Question], modes: list[str]
                      ) -> StageResult:
            nonlocal version
            version += 1
            policy.update_weights(version, str(find_model(str(checkpoint), "checkpoint")))
            by_mode = evaluate.run_questions(policy.rollout, questions, modes, args.batch_size, run=stage)
            every = [r for rollouts, _ in by_mode.values() for r in rollouts]
            records = [{"stage": stage, **evaluate.rollout_record(r)} for r in every]
            return StageResult(stage, version, [], [], 0.0, evaluate.provenance(policy.info(), every),
                               gain_records=records)

        for run in args.run:
            config: dict[str, Any] = json.loads((run / "report.json").read_text())["config"]
            split = split_questions(config["eval_questions"], config["train_questions"], sources=config["sources"],
                                    rl_per_source=config["rl_questions"], rl_sources=config["rl_sources"] or None,
                                    gain_per_source=args.questions,
                                    # A report whose config has no balance_types was split in file order.
                                    balance_types=config.get("balance_types", False))
            questions = evaluate.load_questions(write_jsonl(split.gain, Path(tmp) / f"{run.name}.jsonl"))
            mode = config["ppo"]["mode"]
            stages = [evaluated(path, stage, questions, [mode, "none"])
                      for stage, path in zip(("sft", "rl"), checkpoints(run), strict=True)]
            best = stats.best_constant([q.golden_answers for q in questions])
            print(f"\n{run}: {len(questions)} questions after RL's ({', '.join(config['sources'])}); the best "
                  f"constant answer {best.answer!r} EM {best.exact_match}")
            for wanted in (mode, "none"):
                only = [StageResult(s.stage, s.policy_version, [], [], 0.0, s.provenance,
                                    gain_records=[r for r in s.gain_records if r["mode"] == wanted]) for s in stages]
                gain = held_out_gain(only, wanted)
                assert gain is not None, "SFT and RL evaluated under different corpora or retrievers"
                em = gain["exact_match"]
                print(f"  {wanted:>6}: EM SFT {stats.Estimate(**em['sft'])}  RL {stats.Estimate(**em['rl'])}  "
                      f"SFT -> RL {stats.Estimate(**em['gain'])}  (F1 {stats.Estimate(**gain['f1']['gain'])}); "
                      f"answers with a parenthesis SFT {qualified(only[0].gain_records)}, "
                      f"RL {qualified(only[1].gain_records)}", flush=True)


if __name__ == "__main__":
    main()
