"""Each update's step record (a line of ``steps.jsonl``, the source of the curves and the metrics): the
updater's statistics with the batch's rewards, group signal, the groups trained and skipped by source and
question type, staleness, lengths and what the update cost in queue work and checkpoint."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragr1.services.trainer.checkpoint import size_bytes
from ragr1.services.trainer.loop.groups import has_spread, type_label
from ragr1.v1 import common_pb2

REWARD_PARTS = ("total", "exact_match", "f1", "format", "process")
# The parts whose group spread is logged: a GRPO group whose members all score the same teaches nothing,
# so the share of groups with a spread says whether a reward gives RL any signal at all.
SIGNAL_PARTS = ("total", "exact_match", "f1")
CURVES = (
    "reward_total",
    "reward_sampled",
    "reward_exact_match",
    "signal_total",
    "policy_loss",
    "value_loss",
    "kl",
    "entropy",
    "likelihood_change",
    "response_length",
    "answer_length",
    "clip_fraction",
    "approx_kl",
    "logprob_gap",
    "actor_lr",
    "tokens_per_second",
    "staleness_mean",
    "queue_seconds",
)


def signal_share(scores: Sequence[float], groups: Sequence[str]) -> float:
    """The share of groups (of two or more members) whose members do not all score the same: the groups
    from which group-relative advantages can learn anything."""
    members: dict[str, list[float]] = {}
    for score, group in zip(scores, groups, strict=True):
        members.setdefault(group, []).append(score)
    compared = [values for values in members.values() if len(values) > 1]
    if not compared:
        raise ValueError("no group of two or more rollouts to compare")
    return sum(has_spread(v) for v in compared) / len(compared)


def rewards(rollouts: Sequence[common_pb2.Rollout]) -> dict[str, float]:
    """The batch's mean of each reward part (``reward_<part>``)."""
    return {f"reward_{part}": sum(getattr(r.reward, part) for r in rollouts) / len(rollouts) for part in REWARD_PARTS}


def signals(rollouts: Sequence[common_pb2.Rollout], groups: Sequence[str]) -> dict[str, float]:
    """``signal_<part>``: the share of the batch's groups (``groups``: each rollout's) with a spread in that
    reward part."""
    return {
        f"signal_{part}": signal_share([getattr(r.reward, part) for r in rollouts], groups) for part in SIGNAL_PARTS
    }


def sampled(rollouts: Sequence[common_pb2.Rollout], skipped: Sequence[Sequence[float]]) -> dict[str, float]:
    """The groups dynamic sampling skipped since the last update (their members' total rewards), and the
    mean total reward of everything sampled: the batch and those groups."""
    scores = [r.reward.total for r in rollouts] + [score for group in skipped for score in group]
    return {
        "groups_skipped_uniform": len(skipped),
        "reward_sampled": sum(scores) / len(scores),
        "rollouts_sampled": len(scores),
    }


def groups_by_type(rollouts: Sequence[common_pb2.Rollout], groups: Sequence[str] | None) -> dict[str, int]:
    """How many of the batch's groups (``groups``: each rollout's; None: each rollout a group of its own) came
    from each ``<data source>/<question type>`` (``type_label``), by label."""
    labels = {key: type_label(r) for key, r in zip(groups if groups is not None else range(len(rollouts)), rollouts,
                                                   strict=True)}
    return dict(sorted(Counter(labels.values()).items()))


def lengths(rollouts: Sequence[common_pb2.Rollout]) -> dict[str, float]:
    """Mean and longest response (tokens after the prompt, inserted ones included, as verl counts them),
    mean generated tokens, and mean words of the answer (inside the last <answer>; 0 without one)."""
    response = [len(r.response_token_ids) for r in rollouts]
    return {
        "response_length": sum(response) / len(response),
        "response_length_max": float(max(response)),
        "generated_length": sum(sum(r.loss_mask) for r in rollouts) / len(rollouts),
        "answer_length": sum(len(r.reward.extracted_answer.split()) for r in rollouts) / len(rollouts),
    }


def step_record(
    version: int,
    rollouts: Sequence[common_pb2.Rollout],
    stats: Mapping[str, float],
    *,
    groups: Sequence[str] | None,
    staleness: Sequence[int],
    skipped: Sequence[Sequence[float]],
    skipped_types: Sequence[str],
    queue_seconds: float,
    checkpoint: Path,
    save_seconds: float,
    announced: Mapping[str, object],
) -> dict[str, Any]:
    """The record of the update to ``version`` that trained ``rollouts`` and returned ``stats``.
    ``groups``: each rollout's group, or None with one sample per prompt (no groups to compare);
    ``staleness``: each rollout's versions behind the trainer when trained; ``skipped``: the groups dynamic
    sampling skipped for this update, and ``skipped_types`` their ``type_label``s; ``checkpoint``: the policy's
    weights as the replicas load them; ``announced``: the version as announced to them (empty without a
    publisher)."""
    record: dict[str, Any] = {
        "step": version,
        "version": version,
        "rollout_ids": [r.id for r in rollouts],
        **stats,
        **rewards(rollouts),
        # What the update trained on and what dynamic sampling left out, by source and question type.
        "trained_groups": groups_by_type(rollouts, groups),
        "skipped_groups": dict(sorted(Counter(skipped_types).items())),
    }
    if groups is not None:
        record.update(signals(rollouts, groups))
        # With dynamic sampling: how many groups with a spread the update trained, and how many were sampled to
        # find them (the skipped uniform ones too).
        trained = len(set(groups))
        record.update(groups_trained=trained, groups_sampled=trained + len(skipped))
    record.update(
        {
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": max(staleness),
            "queue_seconds": queue_seconds,
            "queue_share": queue_seconds / max(1e-9, queue_seconds + stats.get("update_seconds", 0.0)),
            "checkpoint": str(checkpoint),
            # What each update costs in weights: written and hashed once to the checkpoint volume, then
            # read by every replica.
            "weights_bytes": size_bytes(checkpoint),
            "save_seconds": save_seconds,
            "announced": dict(announced),
            **sampled(rollouts, skipped),
            **lengths(rollouts),
        }
    )
    return record
