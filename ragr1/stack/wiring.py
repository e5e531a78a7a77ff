"""Which processes make the local stack, with which ports and flags.

Ports come from ``ports.py`` (or are counted from ``--base-port``); each service gets the addresses
of the ones it calls, so the whole wiring of the flow in the README's diagram is written here once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragr1.services.common import ports
from ragr1.services.common.config import flags
from ragr1.services.common.server import ServerConfig
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.config import PPOConfig
from ragr1.stack.config import REWARD_WEIGHTS, StackConfig
from ragr1.stack.supervisor import ServiceSpec

HOST = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class Ports:
    redis: int
    router: int
    http: int
    reward: int
    policy: int
    trainer: int
    shards: tuple[int, ...]
    # Where the ports of the policy replicas after the first begin (``replica``): after the shards'.
    replicas: int

    @classmethod
    def of(cls, config: StackConfig) -> Ports:
        if config.base_port:
            b = config.base_port
            # Metrics ports are gRPC + METRICS_OFFSET, so a block of ports stays clear of them.
            return cls(redis=b, http=b + 1, router=b + 2, reward=b + 3, policy=b + 4, trainer=b + 5,
                       shards=tuple(b + 10 + i for i in range(config.num_shards)), replicas=b + 10 + config.num_shards)
        return cls(redis=ports.REDIS, router=ports.RETRIEVER, http=ports.RETRIEVER_HTTP, reward=ports.REWARD,
                   policy=ports.POLICY, trainer=ports.TRAINER,
                   shards=tuple(ports.RETRIEVER_SHARD + i for i in range(config.num_shards)),
                   replicas=ports.POLICY_REPLICA)

    def replica(self, i: int) -> int:
        """The gRPC port of policy replica ``i`` (0: the first, ``policy``)."""
        return self.policy if i == 0 else self.replicas + i - 1

    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis}/0"


def _spec(name: str, command: Sequence[str], cls: type[ServerConfig], settings: Mapping[str, Any], port: int,
          config: StackConfig, extra: Mapping[str, str] | None = None) -> ServiceSpec:
    """``ragr1 <command>`` listening on ``port`` (metrics on port + METRICS_OFFSET), with ``settings`` as the
    flags of ``cls``, the service's own config: a setting it does not have fails here, in the parent,
    instead of at the child's start."""
    metrics = port + ports.METRICS_OFFSET
    values = {**settings, "host": HOST, "port": port, "metrics_port": metrics}
    return ServiceSpec(
        name=name,
        args=[*command, *flags(cls, values)],
        port=port, metrics_port=metrics, host=HOST, start_timeout=config.start_timeout, extra=dict(extra or {}),
    )


def retrieval_specs(config: StackConfig, p: Ports, index_dir: Path) -> list[ServiceSpec]:
    specs = [
        _spec(f"retriever-shard-{i}", ["serve", "retriever-shard"], ShardConfig,
              {"index": str(index_dir), "shard": i}, port, config)
        for i, port in enumerate(p.shards)
    ]
    specs.append(_spec(
        "retriever", ["serve", "retriever"], RouterConfig,
        {"index": str(index_dir), "shards": [f"{HOST}:{port}" for port in p.shards], "http_port": p.http},
        p.router, config, extra={"http": f"http://{HOST}:{p.http}/retrieve"},
    ))
    return specs


def reward_spec(config: StackConfig, p: Ports) -> ServiceSpec:
    return _spec("reward", ["serve", "reward"], RewardConfig, REWARD_WEIGHTS[config.reward], p.reward, config)


def policy_spec(config: StackConfig, p: Ports, model: Path, settings: Mapping[str, Any] | None = None, *,
                worker: bool = True, name: str = "policy", port: int = 0) -> ServiceSpec:
    """``settings``: more of the policy's (``PolicyConfig``); ``name`` and ``port``: a replica beside the first
    (``port`` 0: ``p.policy``). The worker's consumer name is the service's, stable across restarts, so that
    a restarted worker takes back its pending prompts at once instead of leaving them to the others'
    reclaim (10 minutes by default)."""
    wiring = {
        "model": str(model), "worker_name": name, "retriever_address": f"{HOST}:{p.router}",
        "reward_address": f"{HOST}:{p.reward}", "redis_url": p.redis_url(), "max_turns": config.max_turns,
        "max_tokens_per_turn": config.max_tokens_per_turn, "kv_cache_gib": config.kv_cache_gib,
        "tokens_per_query": config.tokens_per_query, "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs, "max_in_flight": config.max_in_flight,
        "temperature": config.temperature,
    }
    command = ["serve", "rollout-worker" if worker else "policy"]
    return _spec(name, command, PolicyConfig, {**wiring, **(settings or {})}, port or p.policy, config)


def trainer_threads(config: StackConfig, cores: int | None = None) -> int:
    """The PPO trainer shares the machine with a vLLM CPU engine that is generating the next batch while
    the trainer updates: with a thread on every core each parallel region waits for the thread that
    shares vLLM's core, which costs more than the thread brings (bench/trainer/colocation.py measures it).
    Half the cores each, unless configured."""
    return config.trainer_threads or max(1, (cores or os.cpu_count() or 2) // 2)


def trainer_spec(config: StackConfig, p: Ports, model: Path, output_dir: Path,
                 settings: Mapping[str, Any] | None = None) -> ServiceSpec:
    """``settings``: more of the trainer's (``PPOConfig``). The trainer needs no policy address: the rollout
    workers load the versions it announces in Redis."""
    wiring = {
        "model": str(model), "redis_url": p.redis_url(), "output_dir": str(output_dir),
        "threads": trainer_threads(config),
    }
    return _spec("trainer", ["train", "ppo"], PPOConfig, {**wiring, **(settings or {})}, p.trainer, config)
