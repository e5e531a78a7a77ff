"""``ragr1 train ppo``: the PPO loop in a worker thread, ``Trainer.Status`` and metrics on gRPC."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ragr1 import shipped
from ragr1.model_paths import policy_checkpoint
from ragr1.services.common import fleet
from ragr1.services.common.server import ExitWith, GrpcServer
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import NO_SIGNAL_EXIT_CODE, PPOConfig
from ragr1.services.trainer.data import load_tasks
from ragr1.services.trainer.loop.ppo_loop import NoSignal, PPOLoop, TrainerStatus, Updater
from ragr1.services.trainer.model import init_torch, training_device
from ragr1.services.trainer.publisher import PublishError, StrandedAlarm, WeightPublisher, export_backlog
from ragr1.services.trainer.servicer import TrainerServicer
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import PPOUpdater
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


def build_loop(config: PPOConfig, status: TrainerStatus | None = None) -> PPOLoop:
    """Everything checked before any training: the device, the prompts file, Redis, the model. The policy
    replicas are not asked for anything: they follow the versions announced in Redis."""
    build_updater = place(config)
    if config.max_updates == 0 and (config.actor_warmup_ratio > 0 or config.critic_warmup_ratio > 0):
        log.warning("max_updates is 0 (train until stopped): the learning rates start at full, without warm-up")
    prompts = Path(config.prompts_file) if config.prompts_file else shipped.train_path("hotpotqa")
    tasks = load_tasks(prompts, config.mode, config.prompt_limit or None)
    client = config.redis_client()
    client.ping()
    out = Path(config.output_dir)
    return PPOLoop(
        config,
        client,
        tasks,
        build_updater(),
        Checkpointer(out / "checkpoints", config.keep_checkpoints),
        StepLog(out / "steps.jsonl"),
        WeightPublisher(client, config.weights_timeout_seconds),
        status,
    )


async def build_server(config: PPOConfig) -> GrpcServer:
    """The loop built (see ``build_loop``) with ``Trainer.Status`` and the metrics served beside it; the
    training runs in a thread beside the server, and the server stops when it ends."""
    status = TrainerStatus()
    loop = build_loop(config, status)
    server = GrpcServer(config, "trainer")
    server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(status))

    async def train() -> None:
        try:
            version = await asyncio.to_thread(loop.run)
        except PublishError:
            log.error("trainer stopped at version %d", loop.version)
            raise
        except NoSignal as exc:
            raise ExitWith(NO_SIGNAL_EXIT_CODE, f"{exc}; stopped at version {loop.version}") from exc
        log.info("trainer stopped at version %d", version)

    # On SIGTERM the update in hand finishes and is checkpointed and announced: it can take minutes.
    server.beside(train, "the training loop", stop=loop.stop_event.set)

    stranded = StrandedAlarm(config.prompts_stranded_seconds)

    async def watch_backlog() -> None:
        """The fleet's autoscaler and the stranded-prompts alarm read these gauges: kept fresh beside the loop,
        which holds no Redis conversation during an update that can take minutes."""
        while True:
            try:
                backlog = await asyncio.to_thread(loop.workers.backlog)
                export_backlog(backlog)
                stranded.observe(backlog, await asyncio.to_thread(fleet.replicas, loop.workers.redis))
            except Exception as exc:  # Redis down: the gauges keep their last values meanwhile
                log.warning("reading the prompts backlog failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(config.fleet_poll_seconds)

    server.beside(watch_backlog, "the prompts backlog")

    async def close() -> None:
        loop.updater.close()

    server.on_stop(close)
    return server


async def serve(config: PPOConfig) -> int:
    """Trains until ``max_updates``; returns the exit code (1 when the policy replicas do not follow,
    ``NO_SIGNAL_EXIT_CODE`` when dynamic sampling found no group to train on)."""
    server = await build_server(config)
    return await server.serve()
