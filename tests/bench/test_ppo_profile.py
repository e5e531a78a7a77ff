"""bench/trainer/ppo_profile.py at toy sizes on the CPU, so that it runs when a task is lent a GPU: every phase of the
update is timed, each micro-batch size gets its tokens/s with the first as the baseline, and the profiler's
table is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_profile_times_every_phase_and_each_micro_batch_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trainer" / "ppo_profile.py"), "--device", "cpu", "--tiny",
         "--arch", "tiny-qwen2", "--rows", "5", "--micro-batch-tokens", "64", "128"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    ratios = re.findall(r"(\d+)-token micro-batches: one update [\d.]+ s, [\d,]+ tok/s, x([\d.]+)", out)
    assert [size for size, _ in ratios] == ["64", "128"] and ratios[0][1] == "1.00"
    # The update is its phases: critic and actor steps, prepare, the held actor, the likelihood check.
    names = ("step actor", "step critic", "prepare", "_hold_previous_actor", "_likelihood_change")
    phases = dict(re.findall(rf"^\s+({'|'.join(names)})\s+([\d.]+) s", out, re.M))
    assert set(phases) == set(names)
    assert float(phases["step actor"]) > 0 and float(phases["prepare"]) > 0
    assert "profiled update" in out and "aten::mm" in out
