"""``ragr1 serve policy`` and ``ragr1 serve rollout-worker`` (the same server with the worker on)."""

from __future__ import annotations

from typing import Any

from ragr1.model_paths import check_model
from ragr1.services.common.commands import service
from ragr1.services.policy.config import PolicyConfig


def register(commands: Any, serve: Any) -> None:
    server = "ragr1.services.policy.server"
    service(serve, "policy", PolicyConfig, server, check=check_model,
            help="vLLM policy and RAG-R1's search agent loop (Rollout, Generate, UpdateWeights)")
    service(serve, "rollout-worker", PolicyConfig, server, check=check_model, worker=True,
            help="the policy server consuming PromptTasks from Redis and producing scored Rollouts")
