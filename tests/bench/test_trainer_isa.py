"""bench/trainer/isa.py: the capped configuration's environment reaches torch in the child, and the table is
each configuration's median as a ratio of the uncapped float32 row's."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.trainer.isa import AVX2, CONFIGS, table


def test_the_avx2_cap_reaches_a_child_torch() -> None:
    # The cap is read when torch loads: what the bench relies on to time the AVX2 kernels in a process of its own.
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **AVX2}, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() in {"AVX2", "DEFAULT"}  # DEFAULT: a CPU without AVX2 at all


def test_the_table_gives_medians_as_ratios_of_the_first_configuration() -> None:
    names = list(CONFIGS)
    rows = table({
        names[0]: [{"sft": 100.0, "ppo": 50.0}, {"sft": 120.0, "ppo": 40.0}, {"sft": 110.0, "ppo": 45.0}],
        names[1]: [{"sft": 55.0, "ppo": 30.0}],
    })
    first, second = rows[1].split(), rows[2].split()
    assert first[-5:] == ["110.0", "1.00", "45.0", "1.00", "3"]
    assert second[-5:] == ["55.0", "0.50", "30.0", "0.67", "1"]
