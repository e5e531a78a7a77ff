"""Trajectories as the protobuf payloads they travel in: ``Rollout`` and the reward's ``ScoreItem``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from ragr1.protocol.prompts import Mode, Tokenizer
from ragr1.services.common.errors import InvalidArgument
from ragr1.services.policy.agent import Sampling, Task, Trajectory, sample_indexes
from ragr1.v1 import common_pb2, reward_pb2

_MODES = {
    common_pb2.SEARCH_MODE_SINGLE: Mode.SINGLE,
    common_pb2.SEARCH_MODE_MULTI: Mode.MULTI,
    common_pb2.SEARCH_MODE_NONE: Mode.NONE,
    common_pb2.SEARCH_MODE_SEARCH_R1: Mode.SEARCH_R1,
}
SEARCH_MODES = {mode: value for value, mode in _MODES.items()}


class Scorer(Protocol):
    async def score(self, items: Sequence[reward_pb2.ScoreItem]) -> list[common_pb2.RewardParts]: ...


def task_of(message: common_pb2.PromptTask) -> Task:
    """The loop's task; an unspecified mode takes the server's default, an unknown one is refused."""
    if message.mode == common_pb2.SEARCH_MODE_UNSPECIFIED:
        return Task(message.id, message.question)
    if message.mode not in _MODES:
        raise InvalidArgument(f"task {message.id!r}: mode {message.mode} is not a known SearchMode")
    return Task(message.id, message.question, _MODES[message.mode])


def expand(tasks: Sequence[common_pb2.PromptTask], limit: int) -> list[common_pb2.PromptTask]:
    """One entry per sample wanted (``num_samples`` for GRPO groups), at most ``limit`` in all."""
    total = sum(max(1, task.num_samples) for task in tasks)
    if total > limit:
        raise InvalidArgument(f"tasks ask for {total} samples in all; the limit is max_batch={limit}")
    return [task for task in tasks for _ in range(max(1, task.num_samples))]


def sampling_params(sampling: Sampling) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens_per_turn,
        seed=sampling.seed or 0,
        stop=list(sampling.stop),
    )


def to_rollout(
    t: Trajectory, task: common_pb2.PromptTask, tokenizer: Tokenizer, sampling: Sampling, sample: int = 0
) -> common_pb2.Rollout:
    return common_pb2.Rollout(
        # Sample k of a task is "<task id>/k": a prompt that two workers both ran (one was slow and it was
        # reclaimed) yields the same ids twice, which the trainer de-duplicates instead of training twice.
        id=f"{task.id}/{sample}" if task.id else uuid.uuid4().hex,
        task_id=task.id,
        group_id=task.group_id or task.id,
        prompt_token_ids=t.prompt_ids,
        response_token_ids=t.response_ids,
        loss_mask=t.loss_mask,
        behaviour_logprobs=t.logprobs,
        policy_version=t.policy_version,
        num_turns=t.num_turns,
        retrieval_rounds=t.retrieval_rounds,
        num_queries=t.num_queries,
        status=t.status.value,  # type: ignore[arg-type]
        error=t.error,
        response_text=tokenizer.decode(t.response_ids, skip_special_tokens=False),
        generation_seconds=t.generation_seconds,
        retrieval_seconds=t.retrieval_seconds,
        question=task.question,
        golden_answers=list(task.golden_answers),
        mode=SEARCH_MODES[t.mode],
        data_source=task.data_source,
        question_type=task.question_type,
        sampling=sampling_params(sampling),
        spans=[common_pb2.ResponseSpan(text=s.text, kind=s.kind.value) for s in t.spans],  # type: ignore[arg-type]
    )


def score_item(
    rollout: common_pb2.Rollout, task: common_pb2.PromptTask, t: Trajectory
) -> reward_pb2.ScoreItem:
    return reward_pb2.ScoreItem(
        id=rollout.id,
        # Who wrote what: the reward parses only the generated spans as the model's actions.
        spans=list(rollout.spans),
        golden_answers=list(task.golden_answers),
        supporting_titles=list(task.supporting_titles),
        retrieved=[
            common_pb2.Passage(id=p.id, title=p.title, text=p.text, score=p.score) for _, p in t.retrieved
        ],
        retrieved_rounds=[r for r, _ in t.retrieved],
        question_type=task.question_type,
    )


async def build_rollouts(
    trajectories: Sequence[Trajectory],
    tasks: Sequence[common_pb2.PromptTask],
    tokenizer: Tokenizer,
    scorer: Scorer | None,
    sampling: Sampling,
) -> list[common_pb2.Rollout]:
    """Rollout messages for ``trajectories[i]`` of ``tasks[i]``, scored in one call when a scorer is given."""
    rollouts = [
        to_rollout(t, task, tokenizer, sampling, sample=k)
        for k, t, task in zip(sample_indexes([task.id for task in tasks]), trajectories, tasks, strict=True)
    ]
    if scorer is not None and rollouts:
        items = [score_item(r, task, t) for r, task, t in zip(rollouts, tasks, trajectories, strict=True)]
        for rollout, parts in zip(rollouts, await scorer.score(items), strict=True):
            rollout.reward.CopyFrom(parts)
    return rollouts
