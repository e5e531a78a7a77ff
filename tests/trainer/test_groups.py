"""The group buffer alone, on plain deliveries: batches of whole groups, duplicates, groups dropped whole
(stale or with a dead-lettered member), and dynamic sampling: uniform groups never trained, a bound per update."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ragr1.services.common.streams import Delivery
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop.groups import GroupBuffer, has_spread
from tests.trainer.rollouts import make_rollout


class Settled:
    """Stands in for ``Admission.settle``: what the buffer let go of, and whether it was counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], bool]] = []

    def __call__(self, deliveries: Sequence[Delivery[Any]], count: bool = True) -> None:
        self.calls.append(([d.message.id for d in deliveries], count))

    @property
    def ids(self) -> list[str]:
        return [i for ids, _ in self.calls for i in ids]


def buffer(**overrides: Any) -> tuple[GroupBuffer, Settled]:
    settled = Settled()
    config = PPOConfig(**{"batch_size": 4, "mini_batch_size": 2, "samples_per_prompt": 2, **overrides})
    return GroupBuffer(config, settled), settled


def deliver(rollout_id: str, group: str = "", version: int = 0, score: float = 1.0) -> Delivery[Any]:
    return Delivery("1-0", make_rollout(rollout_id, version, group=group, score=score))


def ids(deliveries: Sequence[Delivery[Any]]) -> list[str]:
    return [d.message.id for d in deliveries]


def rollouts(outcome: str) -> float:
    return REGISTRY.get_sample_value("ragr1_trainer_rollouts_total", {"outcome": outcome}) or 0.0


def test_a_batch_holds_only_complete_groups_oldest_first() -> None:
    groups, settled = buffer(batch_size=4)
    groups.admit([deliver("a1", "A"), deliver("b1", "B"), deliver("c1", "C"), deliver("c2", "C")], set())
    assert groups.ready() == 2  # B and A wait for their second member
    groups.admit([deliver("b2", "B"), deliver("a2", "A"), deliver("d1", "D"), deliver("d2", "D")], set())
    assert groups.ready() == 8
    # The groups that began arriving first go first, whatever order their members came in.
    assert ids(groups.take_batch()) == ["a1", "a2", "b1", "b2"]
    assert ids(groups.buffered) == ["c1", "c2", "d1", "d2"]
    assert settled.calls == []


def test_with_one_sample_per_prompt_each_rollout_is_a_group_of_its_own() -> None:
    groups, _ = buffer(batch_size=2, samples_per_prompt=1)
    same_prompt = [deliver("r1", "A"), deliver("r2", "A"), deliver("r3", "A")]
    groups.admit(same_prompt, set())
    assert [groups.group(d.message) for d in same_prompt] == ["r1", "r2", "r3"]
    assert ids(groups.take_batch()) == ["r1", "r2"]
    assert groups.ready() == 1


def test_rollouts_trained_before_and_second_copies_are_settled_not_buffered() -> None:
    groups, settled = buffer()
    before = rollouts("duplicate")
    groups.admit([deliver("old", "O"), deliver("a1", "A")], trained={"old"})
    groups.admit([deliver("a1", "A"), deliver("a2", "A")], trained={"old"})
    assert ids(groups.buffered) == ["a1", "a2"]
    # The trained one is counted out of the window; the copy was never admitted on its own.
    assert settled.calls == [(["old"], True), (["a1"], False)]
    assert rollouts("duplicate") == before + 2


def test_a_group_with_a_stale_member_is_dropped_whole_and_so_are_its_late_members() -> None:
    groups, settled = buffer(max_staleness=1)
    before = rollouts("stale")
    groups.admit([deliver("e1", "E", version=2), deliver("e2", "E", version=0), deliver("f1", "F", version=1)], set())
    assert groups.drop(version=2) == 2  # e1 is fresh but goes with its stale group-mate
    assert ids(groups.buffered) == ["f1"] and settled.calls == [(["e1", "e2"], True)]
    groups.admit([deliver("e3", "E", version=2)], set())
    assert groups.drop(version=2) == 1
    assert settled.ids == ["e1", "e2", "e3"]
    assert rollouts("stale") == before + 3
    assert groups.drop(version=3) == 1  # f1, two versions behind now
    assert groups.buffered == []


def test_a_group_with_a_rejected_member_is_dropped_as_incomplete() -> None:
    groups, settled = buffer()
    before = rollouts("incomplete_group")
    groups.admit([deliver("c1", "C"), deliver("d1", "D")], set())
    groups.reject(make_rollout("c2", group="C"))  # dead-lettered by the queue's validate hook
    assert groups.drop(version=0) == 0  # not stale: nothing for rollouts_dropped_stale
    groups.admit([deliver("c3", "C")], set())
    groups.drop(version=0)
    assert settled.ids == ["c1", "c3"] and ids(groups.buffered) == ["d1"]
    assert rollouts("incomplete_group") == before + 2


def test_dynamic_sampling_keeps_uniform_groups_out_of_every_batch_and_counts_them_against_its_bound() -> None:
    groups, settled = buffer(batch_size=4, max_uniform_groups=2)
    before = rollouts("uniform_group")
    groups.admit(
        [
            deliver("u1", "U"),  # uniform but incomplete: it waits like any group
            deliver("a1", "A"), deliver("a2", "A"),  # both 1: nothing to learn
            deliver("d1", "D"), deliver("d2", "D", score=0.0),
        ],
        set(),
    )
    assert groups.ready() == 0  # D is complete but not looked at yet: only groups found to differ count
    groups.skip_uniform()
    assert settled.calls == [(["a1", "a2"], True)] and groups.skipped == [[1.0, 1.0]]
    assert ids(groups.buffered) == ["u1", "d1", "d2"] and groups.ready() == 2
    assert rollouts("uniform_group") == before + 2
    assert not groups.exhausted()  # one of two skipped: sampling goes on for a full batch
    groups.admit([deliver("g1", "G", score=0.0), deliver("g2", "G", score=0.0), deliver("u2", "U")], set())
    groups.skip_uniform()
    # G and U are skipped too: a uniform group is never trained, whatever the bound.
    assert settled.ids == ["a1", "a2", "u1", "u2", "g1", "g2"] and len(groups.skipped) == 3  # oldest first
    assert groups.exhausted() and groups.ready() == 2  # past the bound: the update takes D alone
    assert ids(groups.take_batch()) == ["d1", "d2"]
    groups.new_update()
    assert groups.skipped == [] and not groups.exhausted()


def test_dynamic_sampling_remembers_what_each_skipped_group_was_sampled_from() -> None:
    groups, _ = buffer(batch_size=4, max_uniform_groups=4)
    kinds = {"P": ("popqa", "single-hop", 0.0), "C": ("hotpotqa", "comparison", 1.0),
             "B": ("hotpotqa", "bridge", 0.0), "S": ("hotpotqa", "bridge", 0.5)}
    groups.admit([Delivery("1-0", make_rollout(f"{g}{i}", group=g, score=score + (g == "S") * i / 4, source=source,
                                               question_type=kind))
                  for g, (source, kind, score) in kinds.items() for i in (1, 2)], set())
    groups.skip_uniform()
    # The uniform ones, oldest first, each by its source and type; S, whose scores differ, is not among them.
    assert groups.skipped_types == [f"{source}/{kind}" for g, (source, kind, _) in kinds.items() if g != "S"]
    assert len(groups.skipped_types) == len(groups.skipped)
    groups.new_update()
    assert groups.skipped_types == []


def test_dynamic_sampling_is_off_by_default() -> None:
    groups, settled = buffer()
    groups.admit([deliver("a1", "A"), deliver("a2", "A")], set())
    groups.skip_uniform()
    assert settled.calls == [] and groups.skipped == [] and groups.ready() == 2 and not groups.exhausted()


@pytest.mark.parametrize(
    ("scores", "spread"), [([1.0, 1.0], False), ([0.0, 0.0, 0.0], False), ([1.0, 0.0], True), ([0.5, 0.5, 0.6], True)]
)
def test_has_spread_says_whether_a_group_scored_differently(scores: list[float], spread: bool) -> None:
    assert has_spread(scores) is spread


class PlainBuffer:
    """The buffer's rules written plainly, every look scanning every buffered rollout (what ``GroupBuffer`` did
    before it kept each group's state as members arrive): the reference the incremental buffer must agree with."""

    def __init__(self, config: PPOConfig, settle: Any) -> None:
        self.config, self.settle, self.buffer, self.dropped, self.skipped = config, settle, [], {}, []
        self.dynamic = config.max_uniform_groups > 0 and config.samples_per_prompt > 1
        self.examined: list[Delivery[Any]] = []  # members of complete groups found to have a spread

    def group(self, rollout: Any) -> str:
        return str(rollout.id) if self.config.samples_per_prompt <= 1 else str(rollout.group_id or rollout.task_id)

    def reject(self, rollout: Any) -> None:
        self.dropped.setdefault(self.group(rollout), "incomplete")

    def admit(self, deliveries: Sequence[Delivery[Any]], trained: set[str]) -> None:
        buffered = {d.message.id for d in self.buffer}
        before, again = [], []
        for d in deliveries:
            if d.message.id in trained:
                before.append(d)
            elif d.message.id in buffered:
                again.append(d)
            else:
                self.buffer.append(d)
                buffered.add(d.message.id)
        if before:
            self.settle(before)
        if again:
            self.settle(again, count=False)

    def drop(self, version: int) -> int:
        for d in self.buffer:
            if version - d.message.policy_version > self.config.max_staleness:
                self.dropped.setdefault(self.group(d.message), "stale")
        out: dict[str, list[Delivery[Any]]] = {"stale": [], "incomplete": []}
        keep = []
        for d in self.buffer:
            reason = self.dropped.get(self.group(d.message))
            (keep if reason is None else out[reason]).append(d)
        self.buffer = keep
        for members in out.values():
            if members:
                self.settle(members)
        return len(out["stale"])

    def complete(self) -> list[list[Delivery[Any]]]:
        size = max(1, self.config.samples_per_prompt)
        by: dict[str, list[Delivery[Any]]] = {}
        for d in self.buffer:
            by.setdefault(self.group(d.message), []).append(d)
        return [members[:size] for members in by.values() if len(members) >= size]

    def batchable(self) -> list[list[Delivery[Any]]]:
        if not self.dynamic:
            return self.complete()
        return [g for g in self.complete() if has_spread([d.message.reward.total for d in g])
                and all(any(d is x for x in self.examined) for d in g)]

    def ready(self) -> int:
        return sum(len(g) for g in self.batchable())

    def skip_uniform(self) -> None:
        if not self.dynamic:
            return
        for members in self.complete():
            scores = [d.message.reward.total for d in members]
            if not has_spread(scores):
                self.buffer = [d for d in self.buffer if all(d is not m for m in members)]
                self.settle(members)
                self.skipped.append(scores)
            else:
                self.examined += members

    def take_batch(self) -> list[Delivery[Any]]:
        batch = [d for g in self.batchable() for d in g][: self.config.batch_size]
        self.buffer = [d for d in self.buffer if all(d is not b for b in batch)]
        return batch

    def new_update(self) -> None:
        self.skipped = []


@pytest.mark.parametrize("seed", range(40))
def test_the_buffer_agrees_with_its_rules_written_plainly_on_random_traffic(seed: int) -> None:
    """Random reads (members of nine groups, some stale, some again, some trained before), dead letters, new
    versions, dynamic sampling and batches: the same settlements, batches, drops and buffer, look after look."""
    rng = random.Random(seed)
    samples = rng.choice([1, 2, 3, 5])
    config = PPOConfig(batch_size=samples * rng.randint(1, 6), mini_batch_size=samples, samples_per_prompt=samples,
                       max_staleness=rng.choice([0, 1, 2]), max_uniform_groups=rng.choice([0, 1, 3]) if samples > 1
                       else 0)
    plain_settled, settled = Settled(), Settled()
    plain, buffer = PlainBuffer(config, plain_settled), GroupBuffer(config, settled)
    version = 0
    for _ in range(80):
        op = rng.random()
        if op < 0.6:
            reads = [deliver(f"g{g}/{rng.randint(0, samples)}", f"g{g}", max(0, version - rng.choice([0, 0, 1, 3])),
                             float(rng.randint(0, 1))) for g in (rng.randint(0, 8) for _ in range(rng.randint(1, 4)))]
            trained = {f"g{rng.randint(0, 8)}/0"} if rng.random() < 0.1 else set()
            plain.admit(reads, trained)
            buffer.admit(reads, trained)
        elif op < 0.7:
            rejected = make_rollout("dead", group=f"g{rng.randint(0, 8)}")
            plain.reject(rejected)
            buffer.reject(rejected)
        elif op < 0.8:
            version += 1
        elif op < 0.9:
            plain.skip_uniform()
            buffer.skip_uniform()
        elif plain.ready() >= config.batch_size:
            assert ids(buffer.take_batch()) == ids(plain.take_batch())
            plain.new_update()
            buffer.new_update()
        assert buffer.drop(version) == plain.drop(version)
        assert buffer.ready() == plain.ready()
        assert ids(buffer.buffered) == ids(plain.buffer)
        assert [ids(g) for g in buffer.complete()] == [ids(g) for g in plain.complete()]
        assert buffer.skipped == plain.skipped
        assert settled.calls == plain_settled.calls
