"""The trainer's view of the fleet (``publisher.WeightPublisher``) on a real Redis: the gauges, and when the
trainer stops because the replicas do not follow. The loop around it: tests/trainer/test_server.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from ragr1.services.common import fleet
from ragr1.services.common.streams import PROMPTS, WORKERS, StreamQueue
from ragr1.services.trainer.publisher import PublishError, StrandedAlarm, WeightPublisher
from ragr1.v1 import common_pb2
from tests.common.waiting import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replicas_gauge(version: int, state: str) -> float | None:
    return REGISTRY.get_sample_value("ragr1_trainer_fleet_replicas", {"version": str(version), "state": state})


def oldest() -> float | None:
    return REGISTRY.get_sample_value("ragr1_trainer_fleet_oldest_version")


def report(client: redis.Redis, name: str, version: int, state: str = fleet.SERVING, target: int = 0,
           reason: str = "", ttl: float = 60) -> None:
    fleet.report(client, fleet.ReplicaReport(name, version, state, target, reason), ttl)


def test_the_fleet_gauges_count_replicas_by_version_and_state(redis_client: redis.Redis, tmp_path: Path) -> None:
    publisher = WeightPublisher(redis_client, timeout=60)
    publisher.publish(3, tmp_path, "a" * 64)
    report(redis_client, "policy-0", 3)
    report(redis_client, "policy-1", 3)
    report(redis_client, "policy-2", 2, fleet.LOADING, target=3)
    report(redis_client, "policy-3", 1, fleet.REFUSED, target=2, reason="digest")
    publisher.watch()
    assert replicas_gauge(3, fleet.SERVING) == 2
    assert replicas_gauge(2, fleet.LOADING) == 1 and replicas_gauge(1, fleet.REFUSED) == 1
    assert oldest() == 2  # the refused replica takes no prompts: it generates nothing
    # A version no replica serves any more leaves the gauge instead of staying at 0.
    fleet.withdraw(redis_client, "policy-3")
    report(redis_client, "policy-2", 3)
    publisher.watch()
    assert replicas_gauge(3, fleet.SERVING) == 3 and replicas_gauge(2, fleet.LOADING) is None
    assert replicas_gauge(1, fleet.REFUSED) is None and oldest() == 3


def test_replicas_whose_heartbeats_stopped_leave_the_gauges(redis_client: redis.Redis, tmp_path: Path) -> None:
    publisher = WeightPublisher(redis_client, timeout=60)
    report(redis_client, "policy-0", 0, ttl=0.2)
    publisher.watch()
    assert replicas_gauge(0, fleet.SERVING) == 1 and oldest() == 0
    # Gone by twice its heartbeat's time to live (the bound is the check: its last look is at 0.4 s or after).
    wait_for(lambda: publisher.watch() == [], "the replica whose heartbeats stopped never left the fleet", 0.4, 0.05)
    assert replicas_gauge(0, fleet.SERVING) is None and math.isnan(oldest())  # type: ignore[arg-type]


def test_a_refusal_alone_stops_nothing_but_a_fleet_refusing_for_the_timeout_does(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A replica that refused a version tries it again (a checkpoint shared storage showed late), so the trainer
    waits out weights_timeout_seconds for it; one replica refusing while another serves stops nothing."""
    clock = Clock()
    publisher = WeightPublisher(redis_client, timeout=100, clock=clock)
    publisher.publish(2, tmp_path, "a" * 64)
    report(redis_client, "policy-0", 1, fleet.REFUSED, target=2, reason="its weights hash to sha256 00")
    report(redis_client, "policy-1", 2)
    publisher.watch()  # one replica serves v2: training goes on without the other
    fleet.withdraw(redis_client, "policy-1")
    publisher.watch()  # every replica refused, once: it will try again
    clock.now = 99.0
    publisher.watch()
    clock.now = 100.0
    with pytest.raises(PublishError, match=r"no policy replica has served weights v2 for 100 s .*policy-0 serves v1, "
                                           r"refused v2: its weights hash to sha256 00"):
        publisher.watch()


def test_a_replica_still_loading_the_starting_weights_does_not_follow_them(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The starting weights are v0, as a replica's own model is: at equal versions, loading or refusing v0 is
    not serving it."""
    clock = Clock()
    publisher = WeightPublisher(redis_client, timeout=10, clock=clock)
    publisher.publish(0, tmp_path, "a" * 64)
    report(redis_client, "policy-0", 0, fleet.REFUSED, target=0, reason="architecture")
    publisher.watch()
    clock.now = 10.0
    with pytest.raises(PublishError, match="weights v0 for 10 s"):
        publisher.watch()
    report(redis_client, "policy-0", 0)  # serving v0
    publisher.watch()


def test_a_fleet_behind_for_the_timeout_stops_the_trainer_and_an_empty_one_never(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    clock = Clock()
    publisher = WeightPublisher(redis_client, timeout=100, clock=clock)
    publisher.watch()  # nothing announced, no replica
    publisher.publish(4, tmp_path, "a" * 64)
    for clock.now in (0.0, 1000.0, 5000.0):  # scaled to zero: a replica that starts loads v4 itself
        publisher.watch()
    report(redis_client, "policy-0", 3, fleet.LOADING, target=4)
    clock.now = 6000.0
    publisher.watch()  # behind from now on
    clock.now = 6099.0
    publisher.watch()
    report(redis_client, "policy-1", 4)  # one replica caught up: the wait starts again when none is
    clock.now = 6200.0
    publisher.watch()
    fleet.withdraw(redis_client, "policy-1")
    clock.now = 6250.0
    publisher.watch()
    clock.now = 6349.0
    publisher.watch()
    clock.now = 6350.0
    with pytest.raises(PublishError, match=r"no policy replica has served weights v4 for 100 s .*"
                                           r"policy-0 serves v3, loading v4"):
        publisher.watch()
    # A new version gives the fleet its own time.
    publisher.publish(5, tmp_path, "b" * 64)
    publisher.watch()


def test_resume_announces_the_weights_redis_lacks_and_refuses_other_runs_announcements(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    start = tmp_path / "start"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"w")
    publisher = WeightPublisher(redis_client, timeout=60)
    publisher.resume(0, start, "s" * 64)  # a fresh run: its starting weights, as v0
    announced = fleet.latest(redis_client)
    assert announced is not None and (announced.version, announced.sha256) == (0, "s" * 64)
    assert announced.files == {"model.safetensors": 1}
    publisher.resume(3, tmp_path, "a" * 64)
    announced = fleet.latest(redis_client)
    assert announced is not None and (announced.version, announced.path) == (3, str(tmp_path.resolve()))
    publisher.resume(3, tmp_path, "a" * 64)  # announced already: nothing written
    assert redis_client.xlen(fleet.WEIGHTS) == 2
    with pytest.raises(PublishError, match=r"Redis announces weights v3 .* this trainer resumes at v3 .*sha256 bbbb"):
        WeightPublisher(redis_client, timeout=60).resume(3, tmp_path, "b" * 64)
    with pytest.raises(PublishError, match="resumes at v2 from"):
        WeightPublisher(redis_client, timeout=60).resume(2, tmp_path, "a" * 64)


def test_the_versions_in_use_are_those_replicas_serve_load_or_retry(redis_client: redis.Redis) -> None:
    publisher = WeightPublisher(redis_client, timeout=60)
    assert publisher.in_use() == set()
    report(redis_client, "policy-0", 5)
    report(redis_client, "policy-1", 2, fleet.LOADING, target=4)
    report(redis_client, "policy-2", 1, fleet.REFUSED, target=3, reason="late")
    assert publisher.in_use() == {5, 2, 4, 1, 3}


def stranded() -> float | None:
    return REGISTRY.get_sample_value("ragr1_trainer_prompts_stranded_seconds")


def test_prompts_are_stranded_only_while_no_replica_takes_prompts(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """On real stream states and replica reports: a fleet scaled up from zero strands nothing once a replica has
    loaded the weights, however long its pod took to come (while it loads them it takes no prompt); a fleet whose
    every replica refused the weights, or never got past its start, strands the prompts, and past the threshold the
    trainer says so once."""
    prompts = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group=WORKERS)
    prompts.ensure_group()
    clock = Clock()
    alarm = StrandedAlarm(600, clock)
    assert REGISTRY.get_sample_value("ragr1_trainer_alarm_threshold", {"alarm": "prompts_stranded"}) == 600

    def observe() -> float:
        return alarm.observe(prompts.backlog(), fleet.replicas(redis_client))

    assert observe() == 0 and stranded() == 0  # no prompt: nothing stranded
    prompts.produce([common_pb2.PromptTask(id="p0", question="q?")])
    assert observe() == 0  # a fleet at zero: the clock starts
    clock.now = 500  # the pods are scheduled and their engines load: still no replica reports
    assert observe() == 500 and stranded() == 500
    report(redis_client, "policy-0", 0, fleet.LOADING, target=3)
    clock.now = 550  # a replica has started and loads the weights: no prompt taken until they are in
    assert observe() == 550 and stranded() == 550
    report(redis_client, "policy-0", 3, fleet.SERVING)
    clock.now = 700  # longer than the threshold since the prompt came, but a replica serves: it takes prompts
    assert observe() == 0
    # Then every replica refuses the weights (or none gets past starting): the prompts are stranded again.
    report(redis_client, "policy-0", 3, fleet.REFUSED, target=4, reason="digest")
    report(redis_client, "policy-1", 0, fleet.STARTING)
    assert observe() == 0
    clock.now = 1000
    with caplog.at_level("WARNING"):
        assert observe() == 300 and not caplog.records
        clock.now = 1300
        assert observe() == 600 and stranded() == 600
        clock.now = 1400
        observe()
    (said,) = [r.getMessage() for r in caplog.records]
    assert "1 prompts have waited or been in progress for 600 s" in said and "refused v4: digest" in said
    report(redis_client, "policy-1", 4, fleet.SERVING)
    assert observe() == 0 and stranded() == 0


def test_a_fleet_that_keeps_refusing_a_version_strands_its_prompts_though_each_retry_loads_it_again(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Every replica refused v3 and tries it again every refusal_retry_seconds, reporting loading, then refused
    again: the retries take no prompt, so they do not start the count again (it counted a loading replica as
    taking prompts, and a fleet refusing a version for good never reached the threshold)."""
    prompts = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group=WORKERS)
    prompts.ensure_group()
    prompts.produce([common_pb2.PromptTask(id="p0", question="q?")])
    clock = Clock()
    alarm = StrandedAlarm(600, clock)
    names = ("policy-0", "policy-1")

    def observe() -> float:
        return alarm.observe(prompts.backlog(), fleet.replicas(redis_client))

    for name in names:
        report(redis_client, name, 2, fleet.SERVING)
    assert observe() == 0
    seen, cycle = [], (fleet.REFUSED, fleet.LOADING)
    with caplog.at_level("WARNING"):
        for step in range(1, 31):  # a report every 30 s, each replica refused, then loading v3 again, in turn
            for i, name in enumerate(names):
                state = cycle[(step + i) % 2]
                report(redis_client, name, 2, state, target=3, reason="digest" if state == fleet.REFUSED else "")
            clock.now = 30.0 * step
            seen.append(observe())
    assert seen == [30.0 * (step - 1) for step in range(1, 31)]  # from the first refusal on, never reset
    assert stranded() == 870
    (said,) = [r.getMessage() for r in caplog.records]
    assert "1 prompts have waited or been in progress for 600 s" in said and "loading v3" in said
