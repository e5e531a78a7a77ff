"""The rollouts read and not yet trained, by group (the samples of one prompt, which GRPO compares with
each other): a batch holds only complete groups, a group with a stale or dead-lettered member is dropped
whole, and dynamic sampling skips complete groups that teach nothing."""

from __future__ import annotations

import logging
from collections.abc import Container, Sequence
from typing import Any, Protocol

from ragr1.services.common.streams import Delivery
from ragr1.services.trainer import metrics
from ragr1.services.trainer.config import PPOConfig
from ragr1.v1 import common_pb2

# The loop's parts log under the name the loop had as one module, which log filters select.
log = logging.getLogger(__package__)

_DROPPED_MEMORY = 10_000


class Settle(Protocol):
    """Acknowledges rollouts the buffer lets go of without training them (``Admission.settle``)."""

    def __call__(self, deliveries: Sequence[Delivery[Any]], count: bool = True) -> None: ...


def has_spread(scores: Sequence[float]) -> bool:
    """Whether a group's members scored differently: a group that scored alike gets zero advantage."""
    return max(scores) - min(scores) > 1e-9


class GroupBuffer:
    """Deliveries of rollouts in arrival order, until they are taken for a batch or settled untrained."""

    def __init__(self, config: PPOConfig, settle: Settle) -> None:
        self.config = config
        self._settle = settle
        self._buffer: list[Delivery[Any]] = []
        # Groups dropped whole, by reason ("stale", "incomplete"): their later members are dropped too.
        self._dropped: dict[str, str] = {}
        # The total rewards of each group dynamic sampling skipped since the last update: with them, the mean
        # reward of everything the policy was sampled on, which is the curve that shows learning (the
        # trained batch holds only groups with a spread, so its mean stays near the middle by design).
        self.skipped: list[list[float]] = []

    @property
    def buffered(self) -> list[Delivery[Any]]:
        return list(self._buffer)

    def group(self, rollout: common_pb2.Rollout) -> str:
        """The rollout's group; with one sample per prompt, each rollout is a group of its own."""
        if self.config.samples_per_prompt <= 1:
            return str(rollout.id)
        return str(rollout.group_id or rollout.task_id)

    def reject(self, rollout: common_pb2.Rollout) -> None:
        """A rollout was dead-lettered: its group can never be complete, so the members already here or
        still coming are dropped."""
        self._dropped.setdefault(self.group(rollout), "incomplete")

    def admit(self, deliveries: Sequence[Delivery[Any]], trained: Container[str]) -> None:
        """Sorts fresh deliveries into the buffer, and settles those whose rollout id is in ``trained`` or
        buffered already (a producer that retried)."""
        buffered = {d.message.id for d in self._buffer}
        trained_before, duplicates = [], []
        for d in deliveries:
            rollout = d.message
            if rollout.id in trained:
                trained_before.append(d)
            elif rollout.id in buffered:
                duplicates.append(d)
            else:
                self._buffer.append(d)
                buffered.add(rollout.id)
        if trained_before:
            # Trained and checkpointed before a crash that came before their acknowledgement.
            self._settle(trained_before)
            metrics.ROLLOUTS.labels("duplicate").inc(len(trained_before))
        if duplicates:
            self._settle(duplicates, count=False)
            metrics.ROLLOUTS.labels("duplicate").inc(len(duplicates))

    def drop(self, version: int) -> int:
        """Settles, without training, every buffered group that has a member staler than ``max_staleness``
        versions behind ``version`` or a member that was dead-lettered; returns how many rollouts were
        dropped as stale."""
        for d in self._buffer:
            if version - d.message.policy_version > self.config.max_staleness:
                self._dropped.setdefault(self.group(d.message), "stale")
        keep: list[Delivery[Any]] = []
        dropped: dict[str, list[Delivery[Any]]] = {"stale": [], "incomplete": []}
        for d in self._buffer:
            reason = self._dropped.get(self.group(d.message))
            (keep if reason is None else dropped[reason]).append(d)
        self._buffer = keep
        if len(self._dropped) > _DROPPED_MEMORY:
            # Members of a group arrive close together; forget the oldest half.
            self._dropped = dict(list(self._dropped.items())[_DROPPED_MEMORY // 2 :])
        for reason, deliveries in dropped.items():
            if not deliveries:
                continue
            self._settle(deliveries)
            metrics.ROLLOUTS.labels("stale" if reason == "stale" else "incomplete_group").inc(len(deliveries))
            log.info("dropped %d rollouts (%s groups)", len(deliveries), reason)
        return len(dropped["stale"])

    def complete(self) -> list[list[Delivery[Any]]]:
        """Buffered groups that have all their samples, oldest first."""
        size = max(1, self.config.samples_per_prompt)
        groups: dict[str, list[Delivery[Any]]] = {}
        for d in self._buffer:
            groups.setdefault(self.group(d.message), []).append(d)
        return [members[:size] for members in groups.values() if len(members) >= size]

    def ready(self) -> int:
        """Rollouts in complete groups: what a batch can be taken from."""
        return sum(len(g) for g in self.complete())

    def skip_uniform(self) -> None:
        """Dynamic sampling: settles, without training, complete groups whose members all scored the same
        total, while this update's cap (``max_uniform_groups``) allows."""
        if self.config.samples_per_prompt <= 1:
            return
        for members in self.complete():
            if len(self.skipped) >= self.config.max_uniform_groups:
                return
            scores = [d.message.reward.total for d in members]
            if has_spread(scores):
                continue
            skipped = {id(d) for d in members}
            self._buffer = [d for d in self._buffer if id(d) not in skipped]
            self._settle(members)
            self.skipped.append(scores)
            metrics.ROLLOUTS.labels("uniform_group").inc(len(members))
            log.info("skipped a group of %d rollouts that all scored %.3f (dynamic sampling)", len(members), scores[0])

    def take_batch(self) -> list[Delivery[Any]]:
        """Up to ``batch_size`` rollouts of complete groups, oldest groups first, out of the buffer."""
        batch = [d for group in self.complete() for d in group][: self.config.batch_size]
        taken = {id(d) for d in batch}
        self._buffer = [d for d in self._buffer if id(d) not in taken]
        return batch

    def new_update(self) -> None:
        """The cap of dynamic sampling is per update: the next one may skip as many groups again."""
        self.skipped = []
