"""``activity.Busy`` and ``activity.Window``, what the policy's rate gauges are counted with when rollouts overlap
(the async worker runs several groups at once): time that activities overlap counts once, and a window gives the
growth over its span. The gauges of overlapping rollouts themselves: tests/policy/test_runtime.py."""

from __future__ import annotations

from ragr1.services.policy.activity import Busy, Window


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_counts_overlapping_activities_once() -> None:
    clock, counted = Clock(), []
    busy = Busy(counted.append, clock)
    busy.begin()  # 100: one starts
    clock.now = 101
    busy.begin()  # 101: a second starts beside it
    clock.now = 103
    busy.end()  # 103: the first ends
    clock.now = 104
    busy.end()  # 104: the second ends; nothing runs until 110
    clock.now = 110
    busy.begin()
    clock.now = 110.5
    assert busy.seconds() == 4.5  # 100-104 and 110-110.5, not 3 + 3 + 0.5
    assert sum(counted) == 4.5


def test_a_window_gives_the_growth_since_its_oldest_record() -> None:
    clock = Clock()
    window = Window(60.0, clock)
    assert window.growth(10.0, 1.0) == (0.0, 0.0)
    clock.now += 30
    assert window.growth(40.0, 4.0) == (30.0, 3.0)
    clock.now += 40  # the first record is 70 s old: out of the window
    assert window.growth(50.0, 6.0) == (10.0, 2.0)
