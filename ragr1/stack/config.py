"""Settings of the local stack and the demo: what to start, on which ports, how big."""

from __future__ import annotations

import dataclasses

from ragr1.services.common.config import setting
from ragr1.services.policy.agent import LoopConfig
from ragr1.stack.supervisor import RestartPolicy

_LOOP = LoopConfig()


@dataclasses.dataclass
class StackConfig:
    run_dir: str = setting("", "where logs, endpoints.json, checkpoints and reports go; empty: runs/<time>")
    base_port: int = setting(0, "0: the default ports of ports.py; else every port counted from this one")
    shards: int = setting(2, "retriever shard processes")
    index_type: str = setting("flat", "flat (exact inner product), ivfpq or hnsw")
    max_passage_tokens: int = setting(128, "encoder tokens kept per passage when indexing")
    model: str = setting("", "policy checkpoint to serve; empty: SmolLM2-135M-Instruct from its package")
    max_turns: int = setting(_LOOP.max_turns, "policy: generation turns before the forced answer turn (RAG-R1: 4)")
    max_tokens_per_turn: int = setting(256, "policy: new tokens per generation turn")
    tokens_per_query: int = setting(_LOOP.tokens_per_query, "policy: document tokens per query in <information>")
    max_model_len: int = setting(_LOOP.max_model_len, "policy: context length (prompt + response)")
    reward: str = setting("em", "what the reward service pays for: em (exact match, RAG-R1's) or f1 "
                          "(token F1: partial credit, a denser signal for small models)")
    kv_cache_gib: int = setting(2, "policy: GiB of RAM for vLLM's KV cache")
    trainer_threads: int = setting(
        0, "PPO trainer: torch threads; 0: half the cores (the policy's vLLM engine computes on the others)"
    )
    start_timeout: float = setting(600.0, "seconds a service may take to become healthy")


@dataclasses.dataclass
class UpConfig(StackConfig):
    index_passages: int = setting(0, "index the first N corpus passages; 0: the whole shipped corpus")
    trainer: bool = setting(True, "start the PPO trainer too (it trains until stopped)")
    auth: bool = setting(
        False, "a random bearer token on every gRPC call and a Redis password, in files under run_dir/secrets"
    )
    max_restarts: int = setting(
        RestartPolicy.max_restarts,
        f"restarts of a service that dies (with backoff) within {RestartPolicy.window_seconds:.0f} s before the "
        "stack stops; 0: stop at the first death",
    )
