"""Settings of the policy server and its rollout-worker mode.

The core's settings are its own classes' (the loop's, the engine's, sampling's, a request's limits), each
defined once there with its default and help; ``PolicyConfig`` is all of them and adds the server's own."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import check_at_least, check_choice, setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import MAX_BACKOFF_MS, QueueConfig
from ragr1.services.policy.agent import LoopConfig, SamplingSettings
from ragr1.services.policy.engine import EngineSettings
from ragr1.services.policy.runtime import RolloutLimits, RolloutLoopSettings
from ragr1.services.policy.streaming import StreamingSettings
from ragr1.services.policy.weights import InFlight


@dataclasses.dataclass
class PolicyConfig(
    LoopConfig, EngineSettings, SamplingSettings, RolloutLimits, RolloutLoopSettings, StreamingSettings, ServerConfig,
    QueueConfig,
):
    port: int = setting(ports.POLICY, "gRPC port; 0 picks a free one")
    model: str = setting(
        "", "checkpoint directory to serve; empty: SmolLM2-135M-Instruct from its package", group="model",
    )
    engine_check_seconds: float = setting(
        5.0, "how often the engine is checked; a dead one turns health NOT_SERVING and stops the server (exit 1)",
        group="model",
    )
    dedup_within_group: bool = setting(True, "no passage twice among one trajectory's queries")
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
    worker_batch: int = setting(8, "rollout_loop lockstep: tasks per rollout batch")
    worker_block_ms: int = setting(1000, "wait for new prompts up to this long per poll")
    reclaim_idle_ms: int = setting(600_000, "take over prompts another worker left unacknowledged this long")
    max_deliveries: int = setting(5, "deliveries before a prompt is dead-lettered")
    # Long enough that the max_deliveries a prompt has outlast a dependency's restart (5, 10, 20 and 40 s between
    # its five deliveries, plus their rollouts), short enough that the prompt is back well within the reclaim time.
    retry_backoff_seconds: float = setting(
        5.0, "a prompt whose work failed for a passing reason (a dependency restarting, an abort) goes back at once "
        "and is handed out again after this long, doubled with each delivery it has had"
    )
    retry_backoff_max_seconds: float = setting(120.0, "the longest backoff of a prompt handed back after a failure")
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

    def trajectory_tokens(self) -> int:
        """The most tokens one trajectory can hold (its prompt, ``max_turns`` full searches and the answer turn,
        within ``max_model_len``): what the engine's KV cache must keep of each running trajectory."""
        return min(self.max_model_len, self.context_needed(self.max_tokens_per_turn))

    def in_flight_policy(self) -> InFlight:
        try:
            return InFlight[self.in_flight.upper()]
        except KeyError:
            raise ValueError(f"in_flight must be 'finish' or 'abort', got {self.in_flight!r}") from None

    def validate(self) -> None:
        super().validate()
        self.in_flight_policy()
        check_at_least(self, (("worker_batch", 1),))
        needed = self.context_needed(self.max_tokens_per_turn)
        if needed > self.max_model_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} cannot hold max_turns={self.max_turns} searches of "
                f"max_queries_per_search={self.max_queries_per_search} queries x tokens_per_query="
                f"{self.tokens_per_query} tokens with max_tokens_per_turn={self.max_tokens_per_turn}: "
                f"that needs about {needed} tokens; raise max_model_len or lower one of the others"
            )
        check_at_least(self, (("reclaim_idle_ms", 1), ("max_deliveries", 1)))
        if not 0 <= self.retry_backoff_seconds <= self.retry_backoff_max_seconds <= MAX_BACKOFF_MS / 1000:
            raise ValueError(
                f"retry_backoff_seconds ({self.retry_backoff_seconds}) must be within 0..retry_backoff_max_seconds "
                f"({self.retry_backoff_max_seconds}), which must be at most {MAX_BACKOFF_MS // 1000}"
            )
        for name in ("engine_check_seconds", "heartbeat_seconds", "refusal_retry_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.checkpoint_wait_seconds < 0:
            raise ValueError(f"checkpoint_wait_seconds must be at least 0, got {self.checkpoint_wait_seconds}")
        check_choice("on_retrieval_error", self.on_retrieval_error, ("requeue", "dead_letter"))
        if self.worker and not self.reward_address:
            raise ValueError("worker mode needs reward_address: rollouts go to the trainer scored")
