"""The weight announcements and the replicas' reports in a real Redis (``common.fleet``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from ragr1.services.common import fleet
from ragr1.services.common.hashing import checkpoint_sha256, missing_files
from ragr1.services.common.streams import PROMPTS, WORKERS, Backlog, StreamQueue
from ragr1.v1 import common_pb2
from tests.common.waiting import wait_for


def test_a_version_is_announced_once_and_read_back(redis_client: redis.Redis) -> None:
    assert fleet.latest(redis_client) is None
    assert fleet.announce(redis_client, 1, "/ck/v000001/policy", "a" * 64)
    # Asked again (a retried command, a restarted trainer), or for an older version: nothing is written.
    assert not fleet.announce(redis_client, 1, "/ck/v000001/policy", "a" * 64)
    assert not fleet.announce(redis_client, 0, "/ck/v000000/policy", "b" * 64)
    assert redis_client.xlen(fleet.WEIGHTS) == 1
    first = fleet.latest(redis_client)
    assert first is not None
    assert (first.version, first.path, first.sha256) == (1, "/ck/v000001/policy", "a" * 64)
    assert first.entry_id and abs(first.at - time.time()) < 60
    assert fleet.announce(redis_client, 2, "/ck/v000002/policy", "c" * 64)
    second = fleet.latest(redis_client)
    assert second is not None and (second.version, second.sha256) == (2, "c" * 64)
    assert second.entry_id > first.entry_id


def test_waiting_for_the_next_announcement_returns_the_newest(redis_client: redis.Redis) -> None:
    """A replica that was busy loading while two versions were announced loads only the newest."""
    assert fleet.next_after(redis_client, "0-0", 20) is None  # nothing announced: waits, then None
    fleet.announce(redis_client, 1, "/ck/1", "1" * 64)
    first = fleet.next_after(redis_client, "0-0", 20)
    assert first is not None and first.version == 1
    assert fleet.next_after(redis_client, first.entry_id, 20) is None
    fleet.announce(redis_client, 2, "/ck/2", "2" * 64)
    fleet.announce(redis_client, 3, "/ck/3", "3" * 64)
    newest = fleet.next_after(redis_client, first.entry_id, 20)
    assert newest is not None and newest.version == 3


def test_the_announcements_keep_a_bounded_history(redis_client: redis.Redis) -> None:
    for version in range(1, 3 * fleet.ANNOUNCEMENTS_KEPT + 1):
        fleet.announce(redis_client, version, f"/ck/{version}", "0" * 64)
    assert fleet.ANNOUNCEMENTS_KEPT <= redis_client.xlen(fleet.WEIGHTS) < 3 * fleet.ANNOUNCEMENTS_KEPT
    newest = fleet.latest(redis_client)
    assert newest is not None and newest.version == 3 * fleet.ANNOUNCEMENTS_KEPT


def test_an_entry_that_is_not_an_announcement_is_named(redis_client: redis.Redis) -> None:
    redis_client.xadd(fleet.WEIGHTS, {"hello": "world"})
    with pytest.raises(ValueError, match=f"{fleet.WEIGHTS} entry .* is not a weight announcement"):
        fleet.latest(redis_client)


def test_replica_reports_expire_and_leave_the_fleet(redis_client: redis.Redis) -> None:
    fleet.report(redis_client, fleet.ReplicaReport("policy-0", 3, fleet.SERVING), ttl_seconds=0.3)
    fleet.report(redis_client, fleet.ReplicaReport("policy-1", 2, fleet.LOADING, target=3), ttl_seconds=60)
    assert [(r.name, r.version, r.state, r.target) for r in fleet.replicas(redis_client)] == [
        ("policy-0", 3, fleet.SERVING, 0), ("policy-1", 2, fleet.LOADING, 3)]
    # Gone by 0.5 s, its report's time to live 0.3 s (the bound is the check: its last look is at 0.5 s or after).
    wait_for(lambda: [r.name for r in fleet.replicas(redis_client)] == ["policy-1"],
             "policy-0, which missed its heartbeats, never left the fleet", 0.5, 0.05)
    assert redis_client.smembers(fleet.REPLICAS) == {b"policy-1"}
    # A heartbeat refreshes the report; a replica that stops leaves at once.
    fleet.report(redis_client, fleet.ReplicaReport("policy-1", 3, fleet.SERVING), ttl_seconds=60)
    assert [(r.version, r.state) for r in fleet.replicas(redis_client)] == [(3, fleet.SERVING)]
    fleet.withdraw(redis_client, "policy-1")
    assert fleet.replicas(redis_client) == [] and not redis_client.exists(fleet.REPLICAS)


def test_a_report_that_does_not_parse_is_not_counted(redis_client: redis.Redis) -> None:
    redis_client.set(fleet.replica_key("odd"), json.dumps({"name": "odd", "colour": "blue"}))
    redis_client.sadd(fleet.REPLICAS, "odd")
    fleet.report(redis_client, fleet.ReplicaReport("policy-0", 1, fleet.SERVING), ttl_seconds=60)
    assert [r.name for r in fleet.replicas(redis_client)] == ["policy-0"]


def test_a_report_names_its_state() -> None:
    with pytest.raises(ValueError, match="replica state must be one of"):
        fleet.ReplicaReport("policy-0", 1, "dancing")
    refused = fleet.ReplicaReport("policy-0", 1, fleet.REFUSED, 2, "digest mismatch")
    assert refused.describe() == "policy-0 serves v1, refused v2: digest mismatch" and not refused.generating
    assert fleet.ReplicaReport("p", 1, fleet.LOADING, 2).generating


def test_an_announcement_carries_the_checkpoint_files_and_their_sizes(redis_client: redis.Redis,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"w" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_bytes(b"{}")
    assert fleet.announce_checkpoint(redis_client, 1, tmp_path)
    announced = fleet.latest(redis_client)
    assert announced is not None
    assert announced.files == {"model.safetensors": 10, "sub/tokenizer.json": 2}
    assert announced.sha256 == checkpoint_sha256(tmp_path)
    assert missing_files(tmp_path, announced.files) == ""
    (tmp_path / "model.safetensors").write_bytes(b"w" * 4)
    (tmp_path / "sub" / "tokenizer.json").unlink()
    said = missing_files(tmp_path, announced.files)
    assert "1 of 2 files absent (e.g. sub/tokenizer.json)" in said and "model.safetensors (4 of 10 bytes)" in said


def workers(client: redis.Redis, consumer: str = "") -> StreamQueue[Any]:
    return StreamQueue(client, PROMPTS, common_pb2.PromptTask, group=WORKERS, consumer=consumer)


def queue(client: redis.Redis, n: int) -> None:
    StreamQueue(client, PROMPTS, common_pb2.PromptTask, group="trainer").produce(
        [common_pb2.PromptTask(id=f"p{i}", question=f"q{i}?") for i in range(n)])


def wanted(client: redis.Redis, per_replica: int = 8) -> int:
    b = workers(client).backlog()
    return fleet.wanted_replicas(b.waiting, b.in_progress, b.holders, per_replica)


def test_the_autoscaler_never_asks_for_fewer_replicas_than_hold_prompts(redis_client: redis.Redis) -> None:
    """The stream states that broke a lag-only rule: every prompt taken (lag 0) while three replicas each
    generate one; the rule keeps the three, where lag alone asked for none."""
    workers(redis_client).ensure_group()
    queue(redis_client, 3)
    for name in ("r0", "r1", "r2"):
        assert len(workers(redis_client, name).consume(1)) == 1
    backlog = workers(redis_client).backlog()
    assert (backlog.waiting, backlog.in_progress, backlog.holders) == (0, 3, 3)
    assert workers(redis_client).undelivered() == 0  # what the lag-only rule saw
    assert wanted(redis_client) == 3
    # Twenty more queued: enough replicas for all 23 at 8 each.
    queue(redis_client, 20)
    assert wanted(redis_client) == 3 and wanted(redis_client, per_replica=4) == 6
    # A replica that leaves hands its prompt back: waiting again, its holder gone.
    assert workers(redis_client, "r2").hand_back() == 1
    backlog = workers(redis_client).backlog()
    assert (backlog.waiting, backlog.in_progress, backlog.holders) == (21, 2, 2)


def test_one_waiting_prompt_wakes_a_fleet_at_zero_whose_group_the_trainer_made(redis_client: redis.Redis) -> None:
    """No replica has ever started: the group exists because the trainer made it, and a waiting prompt asks
    for one replica."""
    assert wanted(redis_client) == 0  # no stream yet: nothing to do
    workers(redis_client).ensure_group()
    assert wanted(redis_client) == 0
    queue(redis_client, 1)
    assert workers(redis_client).backlog() == Backlog(1, 0, 0) and wanted(redis_client) == 1
    assert [g["name"] for g in redis_client.xinfo_groups(PROMPTS)] == [WORKERS.encode()]
    with pytest.raises(ValueError, match="prompts_per_replica must be at least 1"):
        fleet.wanted_replicas(1, 0, 0, 0)
