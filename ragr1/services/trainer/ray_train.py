"""The PPO update, data-parallel under Ray Train (``num_workers > 1``).

Each worker builds the same actor and critic from the same state, runs the no-gradient passes and
advantages on the whole batch (identical on every worker; this keeps batch-wide advantage whitening
and GRPO groups exact), then, mini-batch by mini-batch, takes its share of the rows for the gradient
passes. Gradients are summed with ``all_reduce`` (gloo on CPUs; NCCL on GPUs, one GPU a worker, when
the settings' device resolves to CUDA) before every optimiser step; because every worker's loss is
divided by the mini-batch's token count, the sum is the one-process gradient, so each step matches a single worker's.

State goes to the workers and back through files in a temporary directory (they share the machine
here; on a cluster, point ``tmp_dir`` at shared storage). A TorchTrainer starts per update, which
costs Ray's start-up (about 20 s here) on every update: fine for large updates on many GPUs, the
wrong trade on one small machine, where ``num_workers = 1`` (no Ray) is the default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.model import init_torch
from ragr1.services.trainer.ppo_trainer import PPOUpdater, Sample


def _settings_fields(settings: PPOSettings) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(PPOSettings)}
    return {k: v for k, v in dataclasses.asdict(settings).items() if k in names}


def worker_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker``: one update, this worker's share of each mini-batch; rank 0 writes the result."""
    import ray.train
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    settings = PPOSettings(**config["settings"])
    init_torch(settings)
    # Ray Train gives each GPU worker its own GPU (and makes it current); on CPUs this is the CPU.
    device = ray.train.torch.get_device()
    updater = PPOUpdater.build(settings, Path(config["model_dir"]), device)
    work = Path(config["work_dir"])
    updater.load_state(torch.load(work / "state_in.pt", weights_only=False, map_location="cpu"))
    samples: list[Sample] = torch.load(work / "batch.pt", weights_only=False)
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

    def reduce(tensor: torch.Tensor, op: str) -> None:
        # NCCL reduces only GPU tensors; the statistics live on the CPU (the identity with gloo).
        moved = tensor.to(device)
        dist.all_reduce(moved, op=ops[op])
        tensor.copy_(moved)

    stats = updater.update(samples, rank, world, reduce=reduce)
    if rank == 0:
        torch.save(updater.state(), work / "state_out.pt")
        (work / "stats.json").write_text(json.dumps(stats))


def connect(settings: PPOSettings, num_workers: int) -> bool:
    """Joins the Ray cluster at ``RAY_ADDRESS`` (KubeRay's RayJob sets it), or starts one of
    ``num_workers`` CPUs here; returns whether the workers train on GPUs. The workers' GPUs, not this
    process's, decide: a KubeRay head often has none while its workers do."""
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=False)
    gpus = settings.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
    if settings.device == "cuda" and not gpus:
        raise ValueError("device=cuda, but the Ray cluster has no GPU for the workers; use --device cpu or auto")
    return bool(gpus)


def ray_update(
    settings: PPOSettings,
    model_dir: Path,
    state: dict[str, Any],
    samples: Sequence[Sample],
    num_workers: int,
    tmp_dir: Path | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Runs one update on ``num_workers`` Ray Train workers; returns the new state and the stats."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    gpus = connect(settings, num_workers)
    with tempfile.TemporaryDirectory(dir=tmp_dir, prefix="ray-update-") as work:
        work_dir = Path(work)
        torch.save(state, work_dir / "state_in.pt")
        torch.save(list(samples), work_dir / "batch.pt")
        trainer = TorchTrainer(
            worker_loop,
            train_loop_config={
                "settings": _settings_fields(settings),
                "model_dir": str(model_dir),
                "work_dir": str(work_dir),
            },
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
            scaling_config=ScalingConfig(
                num_workers=num_workers, use_gpu=gpus, resources_per_worker={"CPU": 1, **({"GPU": 1} if gpus else {})}
            ),
            run_config=RunConfig(storage_path=str(work_dir / "ray"), name="ppo-update"),
        )
        trainer.fit()
        new_state = torch.load(work_dir / "state_out.pt", weights_only=False)
        stats = json.loads((work_dir / "stats.json").read_text())
    return new_state, stats


class RayUpdater:
    """The loop's ``Updater`` with the optimisation on Ray Train; keeps a local copy for checkpoints."""

    def __init__(self, settings: PPOSettings, model_dir: Path, num_workers: int) -> None:
        self.settings = settings
        self.model_dir = Path(model_dir)
        self.num_workers = num_workers
        # The copy checkpoints are written from: on the CPU, the GPUs are the workers'.
        self.local = PPOUpdater.build(settings, self.model_dir, torch.device("cpu"))

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        start = time.perf_counter()
        state, stats = ray_update(
            self.settings, self.model_dir, self.local.state(), samples, self.num_workers
        )
        self.local.load_state(state)
        # The workers' own timing leaves out Ray's start-up and the state transfer.
        elapsed = time.perf_counter() - start
        stats.update({"update_seconds": elapsed, "tokens_per_second": stats["tokens"] / elapsed})
        return stats

    def state(self) -> dict[str, Any]:
        return self.local.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.local.load_state(state)

    def save_policy(self, directory: Path) -> None:
        self.local.save_policy(directory)
