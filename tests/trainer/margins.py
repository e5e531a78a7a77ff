"""How close the update test's comparisons come to their tolerances under this process's kernels: for each kind
(statistics, gradients, optimiser steps) the largest distance over its allowance, for both of its cases.

    OMP_NUM_THREADS=1 python -m tests.trainer.margins
    MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL_CBWR=COMPATIBLE python -m tests.trainer.margins

docs/results/2026-11-27-trainer-tolerances.md has the figures of this machine's settings.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

from tests.common.tiny_model import make_tiny_model
from tests.trainer.test_update_on_device import run_both


def main() -> None:
    if os.environ.get("RAGR1_MKLDNN") == "off":
        torch.backends.mkldnn.enabled = False
    model = make_tiny_model(Path(tempfile.mkdtemp(prefix="ragr1-margins-")))
    for mini_batch_size in (6, 3):
        _, compared = run_both(model, mini_batch_size)
        worst: dict[str, tuple[float, str]] = {}
        for what, error, allowed in compared:
            kind = what.split()[0]
            ratio = error / allowed if allowed > 0 else (0.0 if error == 0 else float("inf"))
            if ratio >= worst.get(kind, (-1.0, ""))[0]:
                worst[kind] = (ratio, f"{what}: {error:.3g} apart, {allowed:.3g} allowed")
        for kind, (ratio, what) in worst.items():
            print(f"mini-batches of {mini_batch_size}, {torch.get_num_threads()} threads: {kind:<10} "
                  f"at most {ratio:.2g} of the allowance ({what})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
