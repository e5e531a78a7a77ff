"""The group buffer alone, on plain deliveries: batches of whole groups, duplicates, groups dropped whole
(stale or with a dead-lettered member), and dynamic sampling's cap per update."""

from __future__ import annotations

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


def test_dynamic_sampling_skips_uniform_complete_groups_up_to_the_cap_per_update() -> None:
    groups, settled = buffer(batch_size=4, max_uniform_groups=1)
    before = rollouts("uniform_group")
    groups.admit(
        [
            deliver("u1", "U"),  # uniform but incomplete: it waits like any group
            deliver("a1", "A"), deliver("a2", "A"),  # both 1: nothing to learn
            deliver("d1", "D"), deliver("d2", "D", score=0.0),
            deliver("g1", "G", score=0.0), deliver("g2", "G", score=0.0),
        ],
        set(),
    )
    groups.skip_uniform()
    # A is skipped; G is uniform too but past the cap of one per update, so it stays to be trained.
    assert settled.calls == [(["a1", "a2"], True)] and groups.skipped == [[1.0, 1.0]]
    assert ids(groups.buffered) == ["u1", "d1", "d2", "g1", "g2"]
    assert rollouts("uniform_group") == before + 2
    groups.skip_uniform()
    assert groups.skipped == [[1.0, 1.0]]  # still this update's cap
    groups.new_update()
    assert groups.skipped == []
    groups.skip_uniform()  # the next update may skip one again: G
    assert settled.ids == ["a1", "a2", "g1", "g2"] and groups.skipped == [[0.0, 0.0]]
    groups.admit([deliver("u2", "U")], set())
    groups.skip_uniform()
    assert ids(groups.buffered) == ["u1", "d1", "d2", "u2"]  # U, complete and uniform, is past the cap


def test_dynamic_sampling_is_off_by_default() -> None:
    groups, settled = buffer()
    groups.admit([deliver("a1", "A"), deliver("a2", "A")], set())
    groups.skip_uniform()
    assert settled.calls == [] and groups.skipped == [] and groups.ready() == 2


@pytest.mark.parametrize(
    ("scores", "spread"), [([1.0, 1.0], False), ([0.0, 0.0, 0.0], False), ([1.0, 0.0], True), ([0.5, 0.5, 0.6], True)]
)
def test_has_spread_says_whether_a_group_scored_differently(scores: list[float], spread: bool) -> None:
    assert has_spread(scores) is spread
