"""``ragr1 train ppo``: the PPO loop in a worker thread, ``Trainer.Status`` and metrics on gRPC."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ragr1 import data as shipped
from ragr1.models import policy_checkpoint
from ragr1.services.common.server import GrpcServer, configure_logging
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.data import load_tasks
from ragr1.services.trainer.loop import LoopSettings, PPOLoop, Status, Updater
from ragr1.services.trainer.model import init_torch, training_device
from ragr1.services.trainer.ppo_trainer import PPOUpdater
from ragr1.services.trainer.publisher import PublishError, WeightPublisher
from ragr1.services.trainer.servicer import TrainerServicer
from ragr1.services.trainer.steplog import StepLog
from ragr1.v1 import trainer_pb2_grpc

log = logging.getLogger(__name__)


def place(config: PPOConfig) -> Callable[[], Updater]:
    """Checks where the update will run, before anything else starts (one process: this machine's
    device; Ray workers: the cluster's GPUs), and returns what builds the updater there."""
    init_torch(config)

    if config.num_workers > 1:
        from ragr1.services.trainer.ray_train import RayUpdater, connect

        connect(config, config.num_workers)
        return lambda: RayUpdater(config, policy_checkpoint(config.model), config.num_workers)
    device = training_device(config.device)
    return lambda: PPOUpdater.build(config, policy_checkpoint(config.model), device)


def build_loop(config: PPOConfig, status: Status | None = None) -> PPOLoop:
    """Everything checked before any training: the settings and the device, the prompts file, Redis, that
    the policy replicas take the trainer's credentials, the model."""
    config.validate()
    build_updater = place(config)
    if config.max_updates == 0 and (config.actor_warmup_ratio > 0 or config.critic_warmup_ratio > 0):
        log.warning("max_updates is 0 (train until stopped): the learning rates start at full, without warm-up")
    prompts = Path(config.prompts_file) if config.prompts_file else shipped.train_path("hotpotqa")
    tasks = load_tasks(prompts, config.mode, config.prompt_limit or None)
    client = config.redis_client()
    client.ping()
    out = Path(config.output_dir)
    publisher = None
    if config.policy_replicas:
        publisher = WeightPublisher(
            config.policy_replicas, config.update_timeout_seconds, max_failures=config.max_failed_pushes
        )
        publisher.check()
    settings = LoopSettings(
        batch_size=config.batch_size,
        max_staleness=config.max_staleness,
        max_updates=config.max_updates,
        poll_ms=config.poll_ms,
        samples_per_prompt=config.samples_per_prompt,
        group=config.group,
        consumer=config.consumer,
        start_version=config.start_version,
        logprob_gap_threshold=config.logprob_gap_threshold,
        max_uniform_groups=config.max_uniform_groups,
        trim_streams=config.trim_streams,
    )
    return PPOLoop(
        settings,
        client,
        tasks,
        build_updater(),
        Checkpointer(out / "checkpoints", config.keep_checkpoints),
        StepLog(out / "steps.jsonl"),
        publisher,
        status,
    )


async def serve(config: PPOConfig) -> int:
    """Trains until ``max_updates``; returns the exit code (1 when weights could not reach the policy)."""
    configure_logging(config.log_level)
    status = Status()
    try:
        loop = build_loop(config, status)
    except PublishError as exc:
        log.error("trainer stopped before training: %s", exc)
        return 1
    server = GrpcServer(config, "trainer")
    server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(status), "ragr1.v1.Trainer")
    training = asyncio.ensure_future(asyncio.to_thread(loop.run))

    async def stop_when_trained() -> None:
        await asyncio.wait([training])
        await server.stop()

    async def on_stop() -> None:
        loop.stop_event.set()
        await asyncio.wait([training])

    watcher = asyncio.ensure_future(stop_when_trained())
    try:
        await server.serve(on_stop=on_stop)
    finally:
        watcher.cancel()
        loop.updater.close()
    try:
        version = training.result()
    except PublishError as exc:
        log.error("trainer stopped at version %d: %s", loop.version, exc)
        return 1
    log.info("trainer stopped at version %d", version)
    return 0
