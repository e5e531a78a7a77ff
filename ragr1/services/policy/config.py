"""Settings of the policy server and its rollout-worker mode.

The core's settings are its own classes' (the loop's, the engine's, sampling's, a request's limits), each
defined once there with its default and help; ``PolicyConfig`` is all of them and adds the server's own."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import check_at_least, part_of, same_as, setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import QueueConfig
from ragr1.services.policy.agent import LoopConfig, SamplingSettings
from ragr1.services.policy.engine import EngineSettings
from ragr1.services.policy.follower import FollowerSettings
from ragr1.services.policy.loops import RolloutLoopSettings
from ragr1.services.policy.runtime import RolloutLimits
from ragr1.services.policy.streaming import StreamingSettings
from ragr1.services.policy.weights import InFlight
from ragr1.services.policy.worker import WorkerSettings


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
    on_weight_update: str = setting(
        "finish", "what a weight update does to the rollouts running: 'finish' them on the old version first, "
        "or 'abort' them (handed back at once)"
    )
    # Rollout-worker mode.
    worker: bool = setting(False, "also consume PromptTasks from Redis and produce scored Rollouts")
    worker_name: str = setting(
        "", "consumer name, stable per replica (e.g. the pod name) so that a restarted replica resumes its "
        "pending prompts at once; empty: host-pid"
    )
    worker_batch: int = same_as(WorkerSettings, "worker_batch")
    worker_block_ms: int = same_as(WorkerSettings, "worker_block_ms")
    reclaim_idle_ms: int = same_as(WorkerSettings, "reclaim_idle_ms")
    max_deliveries: int = setting(5, "deliveries before a prompt is dead-lettered")
    retry_backoff_seconds: float = same_as(WorkerSettings, "retry_backoff_seconds")
    retry_backoff_max_seconds: float = same_as(WorkerSettings, "retry_backoff_max_seconds")
    on_retrieval_error: str = same_as(WorkerSettings, "on_retrieval_error")
    stall_seconds: float = same_as(WorkerSettings, "stall_seconds")
    dependency_probe_seconds: float = same_as(WorkerSettings, "dependency_probe_seconds")
    # A rollout worker follows the weight versions the trainer announces in Redis (common/fleet.py).
    heartbeat_seconds: float = same_as(FollowerSettings, "heartbeat_seconds")
    checkpoint_wait_seconds: float = same_as(FollowerSettings, "checkpoint_wait_seconds")
    refusal_retry_seconds: float = same_as(FollowerSettings, "refusal_retry_seconds")

    def worker_settings(self) -> WorkerSettings:
        return part_of(WorkerSettings, self)

    def follower_settings(self) -> FollowerSettings:
        return part_of(FollowerSettings, self)

    def trajectory_tokens(self) -> int:
        """The most tokens one trajectory can hold (its prompt, ``max_turns`` full searches and the answer turn,
        within ``max_model_len``): what the engine's KV cache must keep of each running trajectory."""
        return min(self.max_model_len, self.context_needed(self.max_tokens_per_turn))

    def weight_update_policy(self) -> InFlight:
        try:
            return InFlight[self.on_weight_update.upper()]
        except KeyError:
            raise ValueError(f"on_weight_update must be 'finish' or 'abort', got {self.on_weight_update!r}") from None

    def validate(self) -> None:
        super().validate()
        self.weight_update_policy()
        needed = self.context_needed(self.max_tokens_per_turn)
        if needed > self.max_model_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} cannot hold max_turns={self.max_turns} searches of "
                f"max_queries_per_search={self.max_queries_per_search} queries x tokens_per_query="
                f"{self.tokens_per_query} tokens with max_tokens_per_turn={self.max_tokens_per_turn}: "
                f"that needs about {needed} tokens; raise max_model_len or lower one of the others"
            )
        check_at_least(self, (("max_deliveries", 1),))
        self.worker_settings()
        self.follower_settings()
        if self.engine_check_seconds <= 0:
            raise ValueError(f"engine_check_seconds must be positive, got {self.engine_check_seconds}")
        if self.worker and not self.reward_address:
            raise ValueError("worker mode needs reward_address: rollouts go to the trainer scored")
