"""bench/trainer/ppo_ops.py at toy sizes: one PPO update's and one SFT step's operators counted at two depths, by phase
and by name, and the count at the architecture's own depth derived from them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_count_per_layer_and_at_the_real_depth_follow_from_two_depths() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trainer" / "ppo_ops.py"), "--tiny", "--layers", "1", "3",
         "--rows", "40"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    depths = {
        int(layers): (int(ppo.replace(",", "")), int(sft.replace(",", "")))
        for layers, ppo, sft in re.findall(r"^\s*(\d+) layers: PPO update\s+([\d,]+) operators.*SFT step\s+([\d,]+),",
                                           out, re.M)
    }
    assert set(depths) == {1, 3}
    (ppo1, sft1), (ppo3, sft3) = depths[1], depths[3]
    assert ppo3 > ppo1 > sft1 > 0 and sft3 > sft1
    per_layer = re.search(r"per layer: PPO update ([\d,]+), SFT step ([\d,]+); at 2 layers .*PPO update ([\d,]+) ", out)
    assert per_layer is not None
    # Printed rounded to whole operators.
    assert abs(int(per_layer.group(1).replace(",", "")) - (ppo3 - ppo1) / 2) <= 0.5
    assert abs(int(per_layer.group(3).replace(",", "")) - (ppo1 + (ppo3 - ppo1) / 2)) <= 0.5  # tiny-qwen2: 2 layers
    # Every operator of the update is in a phase: the steps, prepare's passes, the optimisers.
    phases = dict(re.findall(r"^(\S.*?)\s{2,}([\d.]+)\s+[\d.]+$", out.split("by phase:")[1].split("by name:")[0], re.M))
    for phase in ("actor steps (passes)", "critic steps (passes)", "prepare (no-gradient passes)"):
        assert float(phases[phase]) > 0, phase
    assert "aten::mm" in out.split("by name:")[1] or "aten::addmm" in out.split("by name:")[1]
