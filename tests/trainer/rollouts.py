"""Synthetic rollouts shaped like the policy service's (token ids, a masked <information> span,
behaviour log-probs, reward parts), and a small loop on the tiny model, for tests of the queue."""

from __future__ import annotations

import random
from pathlib import Path

import redis

from ragr1.services.common.streams import ROLLOUTS, StreamQueue
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import PPOConfig, PPOSettings
from ragr1.services.trainer.loop import PPOLoop, Updater
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import PPOUpdater
from ragr1.v1 import common_pb2


def make_rollout(
    rollout_id: str,
    version: int = 0,
    *,
    score: float = 1.0,
    seed: int = 0,
    prompt_len: int = 12,
    generated: int = 6,
    inserted: int = 5,
    temperature: float = 1.0,
    group: str = "",
    source: str = "",
    question_type: str = "",
) -> common_pb2.Rollout:
    rng = random.Random(f"{rollout_id}:{seed}")
    response = [rng.randrange(100, 5000) for _ in range(2 * generated + inserted)]
    mask = [1] * generated + [0] * inserted + [1] * generated
    return common_pb2.Rollout(
        id=rollout_id,
        task_id=group or f"task-{rollout_id}",
        group_id=group,
        prompt_token_ids=[rng.randrange(100, 5000) for _ in range(prompt_len)],
        response_token_ids=response,
        loss_mask=mask,
        behaviour_logprobs=[-rng.uniform(0.5, 3.0) if m else 0.0 for m in mask],
        reward=common_pb2.RewardParts(total=score, exact_match=score),
        policy_version=version,
        question="q",
        golden_answers=["a"],
        mode=common_pb2.SEARCH_MODE_MULTI,
        data_source=source,
        question_type=question_type,
        sampling=common_pb2.SamplingParams(temperature=temperature, top_p=1.0),
    )


def _tasks(n: int = 3) -> list[common_pb2.PromptTask]:
    return [
        common_pb2.PromptTask(id=f"t{i}", question=f"question {i}?", golden_answers=["x"]) for i in range(n)
    ]


TINY = {"bf16": False, "lora_rank": 0, "micro_batch_size": 2, "actor_warmup_ratio": 0.0, "critic_warmup_ratio": 0.0}


def tiny_settings(**overrides: object) -> PPOSettings:
    """Settings for the tiny model: fp32, full weights, small micro-batches, no warm-up."""
    return PPOSettings(**{**TINY, **overrides})  # type: ignore[arg-type]


def tiny_config(**overrides: object) -> PPOConfig:
    """The trainer's config for a loop on the tiny model: small batches, short polls, two mini-batches per
    update where the batch divides in two."""
    values: dict[str, object] = {
        **TINY, "batch_size": 4, "max_staleness": 1, "max_updates": 2, "poll_ms": 50, "samples_per_prompt": 1,
        "group": "trainer", "consumer": "trainer-0",
    }
    values.update(overrides)
    batch_size = values["batch_size"]
    assert isinstance(batch_size, int)
    values.setdefault("mini_batch_size", 2 if batch_size % 2 == 0 else 1)
    return PPOConfig(**values)  # type: ignore[arg-type]


def make_loop(
    redis_client: redis.Redis, model_dir: Path, out: Path, updater: Updater | None = None, **overrides: object
) -> PPOLoop:
    """A loop on the tiny model (``overrides``: of ``tiny_config``); ``updater`` defaults to one process built
    from the same config."""
    config = tiny_config(**overrides)
    return PPOLoop(
        config,
        redis_client,
        _tasks(),
        updater or PPOUpdater.build(config, model_dir),
        Checkpointer(out / "checkpoints", keep=10),
        StepLog(out / "steps.jsonl"),
    )


def produce(client: redis.Redis, rollouts: list[common_pb2.Rollout]) -> None:
    StreamQueue(client, ROLLOUTS, common_pb2.Rollout, group="trainer").produce(rollouts)
