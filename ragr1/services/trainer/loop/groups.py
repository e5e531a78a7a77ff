"""The rollouts read and not yet trained, by group (the samples of one prompt, which GRPO compares with
each other): a batch holds only complete groups, a group with a stale or dead-lettered member is dropped
whole, and dynamic sampling keeps groups that teach nothing out of every batch."""

from __future__ import annotations

import heapq
import itertools
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


def type_label(rollout: common_pb2.Rollout) -> str:
    """``<data source>/<question type>`` of a rollout's prompt ("?" for a part it does not carry): what the step
    records count trained and skipped groups by, so that a run says what dynamic sampling trained on."""
    return f"{rollout.data_source or '?'}/{rollout.question_type or '?'}"


def has_spread(scores: Sequence[float]) -> bool:
    """Whether a group's members scored differently: a group that scored alike gets zero advantage."""
    return max(scores) - min(scores) > 1e-9


class GroupBuffer:
    """Deliveries of rollouts in arrival order, until they are taken for a batch or settled untrained.

    Kept by group, with each group's state (complete, its oldest version, marked to be dropped) updated as
    members arrive, so that the loop's look after every read costs what that read brought, not the size of the
    buffer, which is a batch's worth and more when the fleet keeps many trajectories in flight."""

    def __init__(self, config: PPOConfig, settle: Settle) -> None:
        self.config = config
        self._settle = settle
        # Each group's buffered deliveries with their arrival numbers, and the arrival number of its first one
        # (groups go into batches in that order).
        self._groups: dict[str, list[tuple[int, Delivery[Any]]]] = {}
        self._first: dict[str, int] = {}
        self._oldest: dict[str, int] = {}  # the lowest policy version among a group's members
        self._ids: set[str] = set()
        self._arrivals = itertools.count()
        self._complete: set[str] = set()
        # Complete groups dynamic sampling has not looked at yet, by first arrival; and those it found to have a
        # spread, which are the only ones a batch takes while it is on.
        self._unexamined: list[tuple[int, str]] = []
        self._informative: set[str] = set()
        # Groups to settle at the next ``drop``: a stale member, or dropped before.
        self._marked: set[str] = set()
        self._checked_version: int | None = None
        # Groups dropped whole, by reason ("stale", "incomplete"): their later members are dropped too.
        self._dropped: dict[str, str] = {}
        # The total rewards of each group dynamic sampling skipped since the last update (its bound counts them):
        # with them, the mean
        # reward of everything the policy was sampled on, which is the curve that shows learning (the
        # trained batch holds only groups with a spread, so its mean stays near the middle by design).
        self.skipped: list[list[float]] = []
        # Each of those groups' ``type_label``, in the same order.
        self.skipped_types: list[str] = []

    @property
    def size(self) -> int:
        return max(1, self.config.samples_per_prompt)

    @property
    def dynamic(self) -> bool:
        """Whether dynamic sampling is on: only groups whose members scored differently are trained."""
        return self.config.max_uniform_groups > 0 and self.config.samples_per_prompt > 1

    def exhausted(self) -> bool:
        """Whether this update skipped as many uniform groups as dynamic sampling's bound allows: it trains on
        the groups with a spread it holds, fewer than a batch's worth if need be."""
        return self.dynamic and len(self.skipped) >= self.config.max_uniform_groups

    @property
    def buffered(self) -> list[Delivery[Any]]:
        return [d for _, d in sorted(m for members in self._groups.values() for m in members)] if self._groups else []

    def group(self, rollout: common_pb2.Rollout) -> str:
        """The rollout's group; with one sample per prompt, each rollout is a group of its own."""
        if self.config.samples_per_prompt <= 1:
            return str(rollout.id)
        return str(rollout.group_id or rollout.task_id)

    def reject(self, rollout: common_pb2.Rollout) -> None:
        """A rollout was dead-lettered: its group can never be complete, so the members already here or
        still coming are dropped."""
        key = self.group(rollout)
        self._dropped.setdefault(key, "incomplete")
        if key in self._groups:
            self._marked.add(key)

    def admit(self, deliveries: Sequence[Delivery[Any]], trained: Container[str]) -> None:
        """Sorts fresh deliveries into the buffer, and settles those whose rollout id is in ``trained`` or
        buffered already (a producer that retried)."""
        trained_before, duplicates = [], []
        for d in deliveries:
            rollout = d.message
            if rollout.id in trained:
                trained_before.append(d)
            elif rollout.id in self._ids:
                duplicates.append(d)
            else:
                self._add(d)
        if trained_before:
            # Trained and checkpointed before a crash that came before their acknowledgement.
            self._settle(trained_before)
            metrics.ROLLOUTS.labels("duplicate").inc(len(trained_before))
        if duplicates:
            self._settle(duplicates, count=False)
            metrics.ROLLOUTS.labels("duplicate").inc(len(duplicates))

    def _add(self, d: Delivery[Any]) -> None:
        key = self.group(d.message)
        version = d.message.policy_version
        members = self._groups.get(key)
        if members is None:
            members = self._groups[key] = []
            self._first[key] = next(self._arrivals)
            self._oldest[key] = version
        members.append((next(self._arrivals), d))
        self._ids.add(d.message.id)
        self._oldest[key] = min(self._oldest[key], version)
        if key in self._dropped or (
                self._checked_version is not None and self._checked_version - version > self.config.max_staleness):
            self._marked.add(key)
        self._check_complete(key)

    def _check_complete(self, key: str) -> None:
        if len(self._groups[key]) >= self.size and key not in self._complete:
            self._complete.add(key)
            heapq.heappush(self._unexamined, (self._first[key], key))

    def _remove(self, key: str, count: int | None = None) -> list[Delivery[Any]]:
        """Takes the group's first ``count`` members (all by default) out of the buffer; returns them."""
        members = self._groups[key]
        taken, rest = (members, []) if count is None else (members[:count], members[count:])
        for _, d in taken:
            self._ids.discard(d.message.id)
        self._complete.discard(key)
        self._informative.discard(key)
        if rest:  # members past the group's size: a group of their own now, placed by its first one
            self._groups[key] = rest
            self._first[key] = rest[0][0]
            self._oldest[key] = min(d.message.policy_version for _, d in rest)
            self._check_complete(key)
        else:
            del self._groups[key], self._first[key], self._oldest[key]
        return [d for _, d in taken]

    def drop(self, version: int) -> int:
        """Settles, without training, every buffered group that has a member staler than ``max_staleness``
        versions behind ``version`` or a member that was dead-lettered; returns how many rollouts were
        dropped as stale."""
        limit = self.config.max_staleness
        if version != self._checked_version:  # members that were fresh may be stale now
            self._checked_version = version
            self._marked.update(key for key, oldest in self._oldest.items() if version - oldest > limit)
        dropped: dict[str, list[tuple[int, Delivery[Any]]]] = {"stale": [], "incomplete": []}
        for key in self._marked:
            if key not in self._groups:
                continue
            if version - self._oldest[key] > limit:
                self._dropped.setdefault(key, "stale")
            reason = self._dropped.get(key)
            if reason is not None:
                dropped[reason] += self._groups[key]
                self._remove(key)
        self._marked.clear()
        if len(self._dropped) > _DROPPED_MEMORY:
            # Members of a group arrive close together; forget the oldest half.
            self._dropped = dict(list(self._dropped.items())[_DROPPED_MEMORY // 2 :])
        for reason, members in dropped.items():
            if not members:
                continue
            self._settle([d for _, d in sorted(members)])
            metrics.ROLLOUTS.labels("stale" if reason == "stale" else "incomplete_group").inc(len(members))
            log.info("dropped %d rollouts (%s groups)", len(members), reason)
        return len(dropped["stale"])

    def complete(self) -> list[list[Delivery[Any]]]:
        """Buffered groups that have all their samples, oldest first."""
        return [[d for _, d in self._groups[key][: self.size]]
                for key in sorted(self._complete, key=self._first.__getitem__)]

    def _batchable(self) -> set[str]:
        return self._informative if self.dynamic else self._complete

    def ready(self) -> int:
        """Rollouts in the groups a batch can be taken from: complete ones, and with dynamic sampling only
        those whose members scored differently."""
        return self.size * len(self._batchable())

    def skip_uniform(self) -> None:
        """Dynamic sampling (DAPO's): settles, without training, every complete group whose members all scored
        the same total (its group-relative advantage is zero), and marks the others for batches; each complete
        group is looked at once (its first members, the ones a batch takes, do not change), oldest first."""
        if not self.dynamic:
            return
        while self._unexamined:
            first, key = heapq.heappop(self._unexamined)
            if key not in self._complete or self._first.get(key) != first:
                continue  # taken or dropped since
            members = [d for _, d in self._groups[key][: self.size]]
            scores = [d.message.reward.total for d in members]
            if has_spread(scores):
                self._informative.add(key)
                continue
            self._remove(key, self.size)
            self._settle(members)
            self.skipped.append(scores)
            self.skipped_types.append(type_label(members[0].message))
            metrics.ROLLOUTS.labels("uniform_group").inc(len(members))
            log.info("skipped a group of %d rollouts that all scored %.3f (dynamic sampling)", len(members), scores[0])

    def take_batch(self) -> list[Delivery[Any]]:
        """Up to ``batch_size`` rollouts of the groups ``ready`` counts, oldest groups first, out of the buffer."""
        batch: list[Delivery[Any]] = []
        for key in sorted(self._batchable(), key=self._first.__getitem__):
            if len(batch) >= self.config.batch_size:
                break
            batch += self._remove(key, self.size)
        return batch[: self.config.batch_size]

    def new_update(self) -> None:
        """The bound of dynamic sampling is per update: the next one may skip as many groups again."""
        self.skipped = []
        self.skipped_types = []
