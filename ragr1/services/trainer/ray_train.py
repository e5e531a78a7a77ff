"""PPO updates data-parallel under Ray Train (``num_workers > 1``), on one worker group for the whole run.

One ``TorchTrainer`` starts with the run (``WorkerGroup``) and serves requests until the run ends: build the
actor and the critic from a run's settings, FSDP-sharded across the workers (``sharding=fsdp``, verl's) or as whole
copies (``replicate``), load a state, take an update. The driver puts a request's payload in Ray's object store
once and a reference to it on every worker's queue; rank 0 answers on the results queue. Ray's start-up (seconds)
is paid once, not per update; a group outlives the updater built on it, so another updater (other settings, other
sharding) can be built on the same workers.

An update: every worker runs the no-gradient passes and the advantages on the whole batch (identical
everywhere; this keeps batch-wide whitening and GRPO groups exact), then takes its share of each
mini-batch's rows for the gradient passes. Gradients are summed across workers (FSDP's reduce-scatter,
or ``all_reduce`` for whole copies; gloo on CPUs, NCCL with one GPU a worker); every worker's loss is
divided by the mini-batch's token count, so each step is the one a single process would take.

The driver keeps a CPU copy of the trainable state (``RayUpdater.local``), refreshed after every
update, from which checkpoints and published weights are written: the same files as one process writes.
On a cluster the driver and the workers share nothing but Ray: a LoRA state is megabytes; a fully
fine-tuned 7B state (weights and AdamW moments, ~85 GB) should instead be written by the workers to
shared storage (bench/trainer/gpu_sizing.py sizes it), which is not built.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.fsdp import Reduce, process_group_reduce
from ragr1.services.trainer.model import init_torch
from ragr1.services.trainer.updater import PPOUpdater, Sample

log = logging.getLogger(__name__)

# Requests a worker serves; STOP ends its loop (and the TorchTrainer's fit).
BUILD, LOAD, UPDATE, STOP = "build", "load", "update", "stop"


def build_request(settings: PPOSettings, model_dir: Path) -> dict[str, Any]:
    """A BUILD request's payload: the run's settings as plain fields (what ``WorkerRequests`` rebuilds them from)
    and the model every worker starts from."""
    names = {f.name for f in dataclasses.fields(PPOSettings)}
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k in names}
    return {"settings": fields, "model_dir": str(model_dir)}


class WorkerRequests:
    """What one worker does with each request, apart from Ray (which only carries them): BUILD (re)builds the
    models from a run's settings; LOAD and UPDATE need a BUILD before them. ``serve`` returns the answer rank 0
    sends."""

    def __init__(self, device: torch.device, rank: int, world: int, reduce: Reduce) -> None:
        self.device, self.rank, self.world, self.reduce = device, rank, world, reduce
        self.updater: PPOUpdater | None = None
        self.served = 0

    def serve(self, kind: str, payload: Any) -> dict[str, Any]:
        stats: dict[str, float] | None = None
        if kind == BUILD:
            settings = PPOSettings(**payload["settings"])
            init_torch(settings)
            self.updater = None  # the last run's models go before the next ones are built
            self.updater = PPOUpdater.build(settings, Path(payload["model_dir"]), self.device,
                                            shard=settings.sharding == "fsdp")
        elif kind not in (LOAD, UPDATE):
            raise ValueError(f"unknown request {kind!r}; a worker serves {BUILD!r}, {LOAD!r} and {UPDATE!r}")
        elif self.updater is None:
            raise RuntimeError(f"a {kind!r} request before any {BUILD!r}")
        elif kind == LOAD:
            self.updater.load_state(payload)
        else:
            stats = self.updater.update(payload, self.rank, self.world, reduce=self.reduce)
        self.served += 1
        # Gathering a sharded state is a collective: every worker takes part, rank 0 sends it.
        state = self.updater.state() if kind == UPDATE else None
        return {"kind": kind, "stats": stats, "state": state, "pid": os.getpid(), "served": self.served,
                "sharded": self.updater.sharded}


def worker_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker``: serves requests until STOP."""
    import ray
    import ray.train

    context = ray.train.get_context()
    rank = context.get_world_rank()
    # Ray Train gives each GPU worker its own GPU (and makes it current); on CPUs this is the CPU.
    device = ray.train.torch.get_device()
    requests = WorkerRequests(device, rank, context.get_world_size(), process_group_reduce(device))
    inbox, outbox = config["inboxes"][rank], config["outbox"]
    while True:
        kind, ref = inbox.get()
        if kind == STOP:
            return
        answer = requests.serve(kind, ray.get(ref))
        if rank == 0:
            outbox.put(answer)


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


class WorkerGroup:
    """A TorchTrainer's workers kept for the whole run; ``call`` sends every worker one request and
    returns rank 0's answer. ``settings`` says where they train (``device``); what they build comes with BUILD."""

    def __init__(self, settings: PPOSettings, num_workers: int, tmp_dir: Path | None = None) -> None:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
        from ray.util.queue import Queue

        gpus = connect(settings, num_workers)
        # The queues are small actors: no CPU reserved for them, or they would hold the workers' CPUs.
        actor_options = {"num_cpus": 0}
        self.inboxes = [Queue(actor_options=actor_options) for _ in range(num_workers)]
        self.outbox = Queue(actor_options=actor_options)
        self.storage = Path(tempfile.mkdtemp(dir=tmp_dir, prefix="ray-train-"))
        self.trainer = TorchTrainer(
            worker_loop,
            train_loop_config={
                "inboxes": self.inboxes,
                "outbox": self.outbox,
            },
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
            scaling_config=ScalingConfig(
                num_workers=num_workers, use_gpu=gpus, resources_per_worker={"CPU": 1, **({"GPU": 1} if gpus else {})}
            ),
            run_config=RunConfig(storage_path=str(self.storage), name="ppo"),
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._fit, name="ray-train", daemon=True)
        self.thread.start()

    @property
    def num_workers(self) -> int:
        return len(self.inboxes)

    def _fit(self) -> None:
        try:
            self.trainer.fit()
        except BaseException as exc:  # reported by the next call, on the loop's thread
            self.error = exc

    def call(self, kind: str, payload: Any) -> dict[str, Any]:
        import ray
        from ray.util.queue import Empty

        if not self.thread.is_alive():
            raise RuntimeError(f"the Ray Train worker group has stopped: {self.error!r}") from self.error
        ref = ray.put(payload)
        for inbox in self.inboxes:
            inbox.put((kind, ref))
        while True:
            try:
                answer: dict[str, Any] = self.outbox.get(timeout=1.0)
                return answer
            except Empty:
                if not self.thread.is_alive():
                    raise RuntimeError(
                        f"the Ray Train worker group stopped during a {kind!r} request: {self.error!r}"
                    ) from self.error

    def close(self, timeout: float = 60.0) -> None:
        if self.thread.is_alive():
            for inbox in self.inboxes:
                inbox.put((STOP, None))
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("the Ray Train workers did not stop within %.0f s", timeout)
        for queue in [*self.inboxes, self.outbox]:
            queue.shutdown()
        shutil.rmtree(self.storage, ignore_errors=True)


class RayUpdater:
    """The loop's ``Updater`` on a ``WorkerGroup``; keeps a CPU copy to write checkpoints from.

    It starts a group of ``num_workers`` of its own and stops it on ``close``, or builds on ``group``, which its
    owner keeps (and closes)."""

    def __init__(
        self, settings: PPOSettings, model_dir: Path, num_workers: int, tmp_dir: Path | None = None,
        group: WorkerGroup | None = None,
    ) -> None:
        if group is not None and group.num_workers != num_workers:
            raise ValueError(f"the worker group has {group.num_workers} workers, not the {num_workers} asked for")
        self.settings = settings
        self.model_dir = Path(model_dir)
        # The copy checkpoints are written from: on the CPU, the GPUs are the workers'.
        self.local = PPOUpdater.build(settings, self.model_dir, torch.device("cpu"))
        self._owns_group = group is None
        self.group = group if group is not None else WorkerGroup(settings, num_workers, tmp_dir)
        answer = self.group.call(BUILD, build_request(settings, self.model_dir))
        self.sharded = bool(answer["sharded"])
        # The workers start from this copy's state: the same adapters and value head in every process.
        answer = self.group.call(LOAD, self.local.state())
        self.worker_pids = {answer["pid"]}
        log.info("%d Ray Train workers ready, %s", num_workers, "FSDP-sharded" if self.sharded else "whole copies")

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        start = time.perf_counter()
        answer = self.group.call(UPDATE, list(samples))
        self.worker_pids.add(answer["pid"])
        self.local.load_state(answer["state"])
        stats: dict[str, float] = answer["stats"]
        # The workers' own timing leaves out the transfers of the batch and the state.
        elapsed = time.perf_counter() - start
        stats.update({"update_seconds": elapsed, "tokens_per_second": stats["tokens"] / elapsed})
        return stats

    def state(self) -> dict[str, Any]:
        return self.local.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.local.load_state(state)
        self.group.call(LOAD, state)

    def save_policy(self, directory: Path) -> None:
        self.local.save_policy(directory)

    def close(self) -> None:
        if self._owns_group:
            self.group.close()
