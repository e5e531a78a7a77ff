"""bench/demo/runs.py reads demo reports alone: the groups' shares per run and pooled per reward, and the more
held-out answers that carry a parenthesis before and after RL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, name: str, reward: str, groups: list[tuple[int, int]], answers: dict[str, list[str]] | None
         ) -> Path:
    report: dict[str, object] = {
        "config": {"reward": reward, "sft": {"seed": 1}, "ppo": {"seed": 1}},
        "rl_steps": [{"groups_trained": t, "groups_sampled": s} for t, s in groups],
    }
    if answers is not None:
        em = {"mean": 0.1, "low": 0.0, "high": 0.2}
        gain = {"mean": -0.05, "low": -0.1, "high": 0.0}
        report["held_out_gain"] = {"questions": 3, "mode": "multi", "exact_match": {"sft": em, "rl": em, "gain": gain}}
        report["gain_rollouts"] = {stage: [{"answer": a} for a in found] for stage, found in answers.items()}
    run = tmp_path / name
    run.mkdir()
    (run / "report.json").write_text(json.dumps(report))
    if answers is not None:
        (run / "data").mkdir()
        titles = [["Scott Fraser (orienteer)", "Moscow"], ["Paris"], ["CKY (band)"]]
        (run / "data" / "train.jsonl").write_text("".join(json.dumps({"supporting_titles": t}) + "\n" for t in titles))
    return run


def test_shares_per_run_and_reward_and_the_qualified_answers(tmp_path: Path) -> None:
    runs = [
        _run(tmp_path, "a", "f1", [(2, 5), (2, 3)], {"sft": ["Paris", "Oslo", "Rome"],
                                                   "rl": ["Stone (city)", "Dracula (Dracula)", "Rome"]}),
        _run(tmp_path, "b", "em", [(2, 10)], None),
        _run(tmp_path, "c", "f1", [(1, 8)], None),
    ]
    flags = [arg for run in runs for arg in ("--run", str(run))]
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "demo" / "runs.py"), *flags],
                         capture_output=True, text=True, check=True).stdout
    assert "groups trained / sampled per update: 2/5 2/3 (all: 4 of 8, 50%)" in out
    assert "answers with a parenthesis: SFT 0, RL 2 of 3" in out
    assert "SFT questions searching a disambiguated title: 2 of 3" in out
    assert "gain -0.050 [-0.10, 0.00]" in out
    assert "f1: 5 of 16 groups sampled differed (31%)" in out
    assert "em: 2 of 10 groups sampled differed (20%)" in out
