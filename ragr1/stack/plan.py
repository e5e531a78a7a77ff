"""Which processes make the local stack, with which ports and flags.

Ports come from ``ports.py`` (or are counted from ``--base-port``); each service gets the addresses
of the ones it calls, so the whole wiring of the flow in the README's diagram is written here once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ragr1.services.common import ports
from ragr1.stack.config import StackConfig
from ragr1.stack.supervisor import ServiceSpec, StackError

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

    @classmethod
    def of(cls, config: StackConfig) -> Ports:
        if config.base_port:
            b = config.base_port
            # Metrics ports are gRPC + METRICS_OFFSET, so a block of ports stays clear of them.
            return cls(redis=b, http=b + 1, router=b + 2, reward=b + 3, policy=b + 4, trainer=b + 5,
                       shards=tuple(b + 10 + i for i in range(config.shards)))
        return cls(redis=ports.REDIS, router=ports.RETRIEVER, http=ports.RETRIEVER_HTTP, reward=ports.REWARD,
                   policy=ports.POLICY, trainer=ports.TRAINER,
                   shards=tuple(ports.RETRIEVER_SHARD + i for i in range(config.shards)))

    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis}/0"


def _spec(name: str, args: list[str], port: int, config: StackConfig, **extra: str) -> ServiceSpec:
    metrics = port + ports.METRICS_OFFSET
    return ServiceSpec(
        name=name,
        args=[*args, "--host", HOST, "--port", str(port), "--metrics-port", str(metrics)],
        port=port, metrics_port=metrics, host=HOST, start_timeout=config.start_timeout, extra=dict(extra),
    )


def retrieval_specs(config: StackConfig, p: Ports, index_dir: Path) -> list[ServiceSpec]:
    specs = [
        _spec(f"retriever-shard-{i}", ["serve", "retriever-shard", "--index", str(index_dir), "--shard", str(i)],
              port, config)
        for i, port in enumerate(p.shards)
    ]
    shard_list = ",".join(f"{HOST}:{port}" for port in p.shards)
    specs.append(_spec(
        "retriever", ["serve", "retriever", "--index", str(index_dir), "--shards", shard_list,
                      "--http-port", str(p.http)],
        p.router, config, http=f"http://{HOST}:{p.http}/retrieve",
    ))
    return specs


# The reward service's flags for each ``--reward`` of the stack; em is the service's own default (RAG-R1's).
REWARD_WEIGHTS: dict[str, list[str]] = {"em": [], "f1": ["--em-weight", "0", "--f1-weight", "1"]}


def reward_spec(config: StackConfig, p: Ports) -> ServiceSpec:
    if config.reward not in REWARD_WEIGHTS:
        raise StackError(f"--reward must be one of {', '.join(REWARD_WEIGHTS)}, got {config.reward!r}")
    return _spec("reward", ["serve", "reward", *REWARD_WEIGHTS[config.reward]], p.reward, config)


def policy_spec(config: StackConfig, p: Ports, model: Path, *, worker: bool = True, name: str = "policy",
                port: int = 0) -> ServiceSpec:
    """``name`` and ``port``: a replica beside the first (``port`` 0: ``p.policy``). The worker's consumer
    name is the service's, stable across restarts, so that a restarted worker takes back its pending
    prompts at once instead of leaving them to the others' reclaim (10 minutes by default)."""
    args = [
        "serve", "rollout-worker" if worker else "policy", "--model", str(model), "--worker-name", name,
        "--retriever-address", f"{HOST}:{p.router}", "--reward-address", f"{HOST}:{p.reward}",
        "--redis-url", p.redis_url(), "--max-turns", str(config.max_turns),
        "--max-tokens-per-turn", str(config.max_tokens_per_turn), "--kv-cache-gib", str(config.kv_cache_gib),
        "--tokens-per-query", str(config.tokens_per_query), "--max-model-len", str(config.max_model_len),
    ]
    return _spec(name, args, port or p.policy, config)


def trainer_threads(config: StackConfig, cores: int | None = None) -> int:
    """The PPO trainer shares the machine with a vLLM CPU engine that is generating the next batch while
    the trainer updates: with a thread on every core each parallel region waits for the thread that
    shares vLLM's core, and the update ran 1.8-2.2x slower than with one thread on two cores
    (bench/trainer_colocation.py). Half the cores each, unless configured."""
    if config.trainer_threads < 0:
        raise StackError(f"--trainer-threads must be 0 (half the cores) or more, got {config.trainer_threads}")
    return config.trainer_threads or max(1, (cores or os.cpu_count() or 2) // 2)


def trainer_spec(config: StackConfig, p: Ports, model: Path, output_dir: Path, *extra: str,
                 replicas: tuple[int, ...] = ()) -> ServiceSpec:
    """``replicas``: the policy ports the trainer pushes weights to (empty: ``p.policy``)."""
    args = [
        "train", "ppo", "--model", str(model), "--redis-url", p.redis_url(),
        "--policy-replicas", ",".join(f"{HOST}:{port}" for port in replicas or (p.policy,)),
        "--output-dir", str(output_dir),
        "--threads", str(trainer_threads(config)), *extra,
    ]
    return _spec("trainer", args, p.trainer, config)
