"""The trainer intake's group buffer alone: CPU per rollout as the buffer grows, against the buffer of a baseline
commit, in the same run.

The PPO loop reads the rollouts stream and, after each read, sorts what came into the buffer, drops stale groups,
looks for groups that teach nothing (dynamic sampling) and counts the rollouts ready for a batch; the buffer holds
up to a batch's worth and more, and a batch grows with the trajectories the fleet keeps in flight. Here groups
of ``--samples`` rollouts arrive interleaved (``--spread`` groups at a time), a few rollouts per read, until a batch
of ``--batch-sizes`` is ready and taken, as ``PPOLoop.collect`` and ``train_batch`` call the buffer. The baseline
is ``ragr1/services/trainer/loop/groups.py`` at ``--baseline`` (git), loaded beside the current one.

    PYTHONPATH=. python bench/fleet/group_buffer.py [--baseline df50e56] [--batch-sizes 250 1000 4000 16000]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import commit  # noqa: E402
from ragr1.services.common.streams import Delivery  # noqa: E402
from ragr1.services.trainer.config import PPOConfig  # noqa: E402
from ragr1.services.trainer.loop import groups as current  # noqa: E402
from ragr1.v1 import common_pb2  # noqa: E402

GROUPS = "ragr1/services/trainer/loop/groups.py"


def baseline_module(revision: str, directory: Path) -> Any:
    source = subprocess.run(["git", "show", f"{revision}:{GROUPS}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    path = directory / "baseline_groups.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_groups", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arrivals(batch: int, samples: int, spread: int, seed: int) -> list[list[Delivery[Any]]]:
    """Reads of 1 to ``samples`` rollouts, groups finishing interleaved, until ``batch`` rollouts came."""
    rng = random.Random(seed)
    open_groups: list[list[common_pb2.Rollout]] = []
    made, out, n = 0, [], 0
    pending: list[common_pb2.Rollout] = []
    while made < batch:
        while len(open_groups) < spread and made + sum(map(len, open_groups)) < batch:
            g = f"g{n}"
            n += 1
            open_groups.append([common_pb2.Rollout(id=f"{g}/{k}", group_id=g, task_id=g, policy_version=0,
                                                   reward=common_pb2.RewardParts(total=float(k % 2)))
                                for k in range(samples)])
        group = rng.choice(open_groups)
        pending.append(group.pop())
        made += 1
        if not group:
            open_groups.remove(group)
        if len(pending) >= rng.randint(1, samples):
            out.append([Delivery(f"{len(out)}-0", r) for r in pending])
            pending = []
    if pending:
        out.append([Delivery(f"{len(out)}-0", r) for r in pending])
    return out


def cpu_per_rollout(module: Any, batch: int, samples: int, reads: list[list[Delivery[Any]]]) -> float:
    config = PPOConfig(batch_size=batch, mini_batch_size=batch, samples_per_prompt=samples)
    buffer = module.GroupBuffer(config, lambda deliveries, count=True: None)
    trained: set[str] = set()
    start = time.process_time()
    for read in reads:  # what PPOLoop.collect does after each read
        buffer.admit(read, trained)
        buffer.drop(0)
        buffer.skip_uniform()
        max(samples, batch - buffer.ready())
        buffer.ready()
    taken = buffer.take_batch()
    seconds = time.process_time() - start
    assert len(taken) == batch, (len(taken), batch)
    return seconds / batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="df50e56")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[250, 1000, 4000, 16000])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--spread", type=int, default=200, help="groups arriving at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"commit {commit()}, baseline {args.baseline}; {args.samples} samples per group, "
          f"{args.spread} groups arriving at once, 1 to {args.samples} rollouts per read")
    print("| batch (rollouts) | reads | baseline us/rollout | current us/rollout | ratio |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_module(args.baseline, Path(tmp))
        for batch in args.batch_sizes:
            reads = arrivals(batch, args.samples, args.spread, args.seed)
            old = cpu_per_rollout(base, batch, args.samples, reads)
            new = cpu_per_rollout(current, batch, args.samples, reads)
            print(f"| {batch} | {len(reads)} | {old * 1e6:.1f} | {new * 1e6:.1f} | x{old / new:.1f} |", flush=True)


if __name__ == "__main__":
    main()
