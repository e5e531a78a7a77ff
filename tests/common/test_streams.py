"""The Redis Streams queue against a real Redis server, with a consumer process that really dies."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragr1.services.common.redis_client import connect
from ragr1.services.common.redis_server import RedisServer
from ragr1.services.common.streams import HANDED_BACK, PROMPTS, ROLLOUTS, Backlog, StreamQueue
from ragr1.services.trainer.loop import check_rollout
from ragr1.v1 import common_pb2
from tests.common import fuzz
from tests.common.waiting import holds_for, wait_for
from tests.trainer.rollouts import make_rollout

HANDED = "test:handed"


def rollout(i: int) -> common_pb2.Rollout:
    return common_pb2.Rollout(
        id=f"r{i:04d}", task_id=f"t{i}", response_token_ids=[1, 2, 3], loss_mask=[1, 0, 1],
        behaviour_logprobs=[-0.1, 0.0, -0.2], policy_version=3,
    )


def test_killed_consumer_is_reclaimed_and_every_id_is_handed_on_once(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    producer = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer")
    producer.ensure_group()
    producer.produce(rollout(i) for i in range(1000))
    redis_client.xadd(ROLLOUTS, {"id": "poison", "data": b"\xff\xfe not a protobuf"})
    producer.produce([rollout(5)])  # a producer retry: same message id again

    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.common.stream_consumer", redis_server.url, "300", "100", HANDED],
        stdout=subprocess.PIPE, text=True,
    )
    assert doomed.stdout is not None
    assert doomed.stdout.readline().strip() == "TAKEN 300 ACKED 100"
    doomed.kill()
    doomed.wait(timeout=10)

    survivor = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="survivor")
    assert survivor.pending() == 200
    reclaimed = 0

    def drained() -> bool:  # one round of the survivor's work: take over, read on, acknowledge
        nonlocal reclaimed
        batch = survivor.reclaim(min_idle_ms=0) + survivor.consume(count=128, block_ms=200)
        reclaimed += sum(1 for d in batch if d.deliveries > 1)
        if not batch and survivor.pending() == 0:
            return True
        survivor.ack(batch, also=lambda pipe, b=batch: b and pipe.rpush(HANDED, *[d.message.id for d in b]))
        return False

    wait_for(drained, "the survivor never drained the stream", 60, 0)

    handed = [v.decode() for v in redis_client.lrange(HANDED, 0, -1)]
    assert len(handed) == 1000
    assert sorted(handed) == [f"r{i:04d}" for i in range(1000)]
    assert reclaimed == 200
    assert survivor.pending() == 0
    dead = survivor.dead_letters()
    assert [d["id"] for d in dead] == ["poison"]
    assert "payload is not a Rollout" in dead[0]["reason"]


def test_entry_delivered_too_often_is_dead_lettered(redis_client: redis.Redis) -> None:
    producer = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers")
    producer.ensure_group()
    producer.produce([common_pb2.PromptTask(id="p1", question="Who wrote Hamlet?")])
    # Every consumer takes it and dies before acknowledging.
    first = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="c0",
                        max_deliveries=3)
    assert [d.message.id for d in first.consume(count=10)] == ["p1"]
    deliveries = []
    for n in range(1, 4):
        worker = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer=f"c{n}",
                             max_deliveries=3)
        deliveries.append([d.deliveries for d in worker.reclaim(min_idle_ms=0)])
    assert deliveries == [[2], [3], []]
    dead = worker.dead_letters()
    assert [(d["id"], d["reason"]) for d in dead] == [("p1", "delivered 4 times (max 3)")]
    assert worker.pending() == 0


def test_validation_failure_is_dead_lettered_and_the_consumer_goes_on(redis_client: redis.Redis) -> None:
    def same_lengths(r: common_pb2.Rollout) -> str | None:
        n = len(r.response_token_ids)
        if len(r.loss_mask) != n or len(r.behaviour_logprobs) != n:
            return f"lengths disagree: tokens {n}, mask {len(r.loss_mask)}, logprobs {len(r.behaviour_logprobs)}"
        return None

    queue = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t",
                        validate=same_lengths)
    queue.ensure_group()
    broken = rollout(1)
    broken.loss_mask.append(1)
    queue.produce([rollout(0), broken, rollout(2)])
    got = queue.consume(count=10)
    assert [d.message.id for d in got] == ["r0000", "r0002"]
    assert queue.dead_letters()[0]["reason"] == "lengths disagree: tokens 3, mask 4, logprobs 3"


def test_restarted_consumer_gets_its_own_pending_entries_back(redis_client: redis.Redis) -> None:
    queue = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t")
    queue.ensure_group()
    queue.produce(rollout(i) for i in range(5))
    assert len(queue.consume(count=3)) == 3
    again = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t")
    pending = again.consume(count=10, pending=True)
    assert [(d.message.id, d.deliveries) for d in pending] == [("r0000", 2), ("r0001", 2), ("r0002", 2)]
    again.ack(pending)
    assert again.consume(count=10, pending=True) == []
    assert [d.message.id for d in again.consume(count=10)] == ["r0003", "r0004"]


def test_work_left_for_a_group_is_pending_plus_undelivered(redis_client: redis.Redis) -> None:
    prompts = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="w1")
    assert prompts.undelivered() == 0  # no stream yet
    prompts.ensure_group()
    prompts.produce(common_pb2.PromptTask(id=f"p{i}", question="q") for i in range(5))
    assert (prompts.pending(), prompts.undelivered()) == (0, 5)
    taken = prompts.consume(2)
    assert (prompts.pending(), prompts.undelivered()) == (2, 3)
    prompts.ack(taken)
    assert (prompts.pending(), prompts.undelivered()) == (0, 3)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(
        st.one_of(
            st.builds(lambda b: {"data": b}, fuzz.requests(common_pb2.Rollout.DESCRIPTOR)),
            st.dictionaries(st.sampled_from([b"id", b"x", b"\xff\xfe"]), st.binary(max_size=16), max_size=2),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_garbage_entries_are_dead_lettered_with_a_reason_and_nothing_is_lost(
    redis_client: redis.Redis, entries: list[dict[str, bytes]]
) -> None:
    """Whatever lands in the rollouts stream, the trainer's consumer hands on what parses and passes the
    trainer's own check, dead-letters the rest with a reason, and loses nothing."""
    redis_client.delete(ROLLOUTS, f"{ROLLOUTS}:dead")
    queue = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t",
                        validate=lambda r: check_rollout(r, 10))
    queue.ensure_group()
    for fields in entries:
        redis_client.xadd(ROLLOUTS, fields or {"empty": b""})  # type: ignore[arg-type]
    good = make_rollout("good")
    queue.produce([good])
    handed = [d.message.id for d in queue.consume(count=100)]
    dead = queue.dead_letters()
    assert good.id in handed
    assert all(d["reason"] for d in dead)
    assert len(handed) + len(dead) == len(entries) + 1 - (len(handed) - len(set(handed)))


def test_a_queue_client_rides_out_a_redis_restart_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """SIGKILLed Redis, restarted 1.5 s later from its append-only file (as ``ragr1 up`` or Kubernetes
    restart it): a client from ``connect`` waits it out instead of raising, and every entry written
    before the kill is still there (appendfsync always: nothing acknowledged is lost)."""
    server = RedisServer(data_dir=tmp_path).start()
    try:
        queue = StreamQueue(connect(server.url), ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t")
        queue.ensure_group()
        queue.produce(rollout(i) for i in range(50))
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        restart = threading.Timer(1.5, server.start)
        restart.start()
        started = time.monotonic()
        got = queue.consume(100)  # sent while Redis is down
        waited = time.monotonic() - started
        restart.join()
        assert [d.message.id for d in got] == [rollout(i).id for i in range(50)]
        assert waited >= 1.0
        plain = redis.Redis.from_url(server.url)
        server.process.send_signal(signal.SIGKILL)  # without connect: the first refused connection raises
        server.process.wait()
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        server.stop()


def test_a_passworded_redis_refuses_a_client_without_it_and_takes_the_password_from_a_file(tmp_path: Path) -> None:
    """Redis AUTH as the workers and the trainer use it (``redis_password_file``): a password with quotes,
    backslashes and non-ASCII text reaches redis-server in a file only its owner reads (not on its
    command line); a client without it is refused; a missing password file is an error naming the file."""
    password = 'pa ss "wo\\rd" é'
    server = RedisServer(data_dir=tmp_path / "redis", password=password).start()
    try:
        assert server.process is not None and password not in " ".join(map(str, server.process.args))
        assert (tmp_path / "redis" / "auth.conf").stat().st_mode & 0o777 == 0o600
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url).xlen(PROMPTS)
        secret = tmp_path / "redis-password"
        secret.write_text(password + "\n")
        queue = StreamQueue(connect(server.url, str(secret)), ROLLOUTS, common_pb2.Rollout, group="g", consumer="c")
        queue.ensure_group()
        queue.produce([rollout(0)])
        assert [d.message.id for d in queue.consume(1)] == [rollout(0).id]
        with pytest.raises(ValueError, match=f"redis_password_file {tmp_path / 'missing'}"):
            connect(server.url, str(tmp_path / "missing"))
        # A wrong password is said at once, not retried like a Redis that is down (~30 s).
        (tmp_path / "wrong").write_text("not it\n")
        started = time.monotonic()
        with pytest.raises(redis.AuthenticationError):
            connect(server.url, str(tmp_path / "wrong")).xlen(PROMPTS)
        assert time.monotonic() - started < 5
    finally:
        server.stop()


def test_trim_deletes_only_what_every_consuming_group_is_done_with(redis_client: redis.Redis) -> None:
    """What a consumer still needs stays: its pending entries (a restart re-reads them) and the entries
    not yet delivered; what is acknowledged before the oldest pending entry goes. The producer's own
    group reads nothing and holds nothing back; with no consuming group, nothing goes."""
    tasks = [common_pb2.PromptTask(id=f"p{i}", question=f"q{i}") for i in range(10)]
    producer = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="trainer")
    producer.ensure_group()
    producer.produce(tasks)
    assert producer.trim() == 0 and producer.depth() == 10  # no worker group yet: it will read from the start
    worker = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="w0")
    worker.ensure_group()
    got = worker.consume(6)
    worker.ack([got[i] for i in (0, 1, 3, 4)])  # p2 and p5 still being worked on, p6-p9 not delivered
    assert producer.trim() == 2 and producer.depth() == 8  # p0, p1; p3 and p4 wait behind pending p2
    restarted = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="w0")
    assert [d.message.id for d in restarted.consume(10, pending=True)] == ["p2", "p5"]
    rest = restarted.consume(10)
    assert [d.message.id for d in rest] == ["p6", "p7", "p8", "p9"]
    restarted.ack(rest)
    assert producer.trim() == 0  # p2 pending: nothing after it goes
    restarted.ack([d for d in got if d.message.id in ("p2", "p5")])
    assert producer.trim() == 8 and producer.depth() == 0


def test_each_entry_names_its_producer_and_the_consumer_reads_the_message_alone(redis_client: redis.Redis) -> None:
    """A rollout worker names itself in each rollout's entry (audits see which replica made what); the
    trainer's consumer gets the same messages either way."""
    queue = StreamQueue(redis_client, ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t")
    queue.ensure_group()
    queue.produce([rollout(0)], producer="policy-1")
    queue.produce([rollout(1)])
    entries = redis_client.xrange(ROLLOUTS)
    assert [fields.get(b"producer") for _, fields in entries] == [b"policy-1", None]  # type: ignore[union-attr]
    assert [d.message for d in queue.consume(count=10)] == [rollout(0), rollout(1)]


def test_an_entry_retried_goes_back_at_once_with_a_delivery_counted_and_is_due_after_its_backoff(
    redis_client: redis.Redis,
) -> None:
    """A consumer whose work failed for a passing reason hands the entry back: no longer in progress, waiting,
    taken by another consumer once its backoff has passed (whatever that consumer's reclaim threshold) with the
    failed delivery counted, and not before; an entry that keeps failing is dead-lettered after max_deliveries."""
    a = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id="soon", question="q"), common_pb2.PromptTask(id="later", question="q")])
    soon, later = a.consume(2)
    retried = time.monotonic()
    assert a.retry([later.entry_id], backoff_ms=3_600_000) == 1 and a.retry([soon.entry_id], backoff_ms=1500) == 1
    assert a.backlog().waiting == 2 and a.backlog().in_progress == 0
    b = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="b", max_deliveries=2)
    taken: list[Any] = []
    wait_for(lambda: taken, "the retried entry was never due", 20, 0.05,
             step=lambda: taken.extend(b.reclaim(600_000, 10)))
    assert time.monotonic() - retried >= 1.5  # not before its backoff
    assert [(d.message.id, d.deliveries) for d in taken] == [("soon", 2)]  # the failed delivery counted
    assert [r["consumer"] for r in redis_client.xpending_range(PROMPTS, "workers", later.entry_id, later.entry_id, 1)
            ] == [HANDED_BACK.encode()]  # still backing off
    # It fails again on b, its second delivery of max_deliveries 2: the next one would be its third.
    b.retry([taken[0].entry_id], backoff_ms=0)
    c = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="c", max_deliveries=2)
    assert c.reclaim(600_000, 10) == []
    assert [(d["id"], d["reason"]) for d in c.dead_letters()] == [("soon", "delivered 3 times (max 2)")]


def test_a_live_consumer_keeps_its_lease_by_renewing_it_and_loses_it_once_it_stops(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Work that runs longer than the reclaim threshold stays with its consumer while the consumer renews its
    lease (no delivery counted); once it stops renewing (dead, paused), another consumer reclaims the entry after
    the threshold, and the old owner's renewal then leaves it with the new one."""
    threshold_ms = 300
    a = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id="long", question="q")])
    (work,) = a.consume(1)
    b = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="b")
    stolen: list[Any] = []

    def kept() -> bool:  # a renews three times a threshold; b looks as often
        assert a.renew([work.entry_id]) == 1
        stolen.extend(b.reclaim(threshold_ms, 10))
        return not stolen

    # The work runs four thresholds long.
    holds_for(kept, "a consumer renewing its lease keeps its work", 4 * threshold_ms / 1000, threshold_ms / 3000)
    assert stolen == []
    taken: list[Any] = []
    wait_for(lambda: taken, "never reclaimed once a stopped", 10, 0.05,
             step=lambda: taken.extend(b.reclaim(threshold_ms, 10)))
    assert [(d.message.id, d.deliveries) for d in taken] == [("long", 2)]
    assert f"b took over 1 entries from a, idle for {threshold_ms} ms or more" in caplog.text
    assert a.renew([work.entry_id]) == 0
    assert [r["consumer"] for r in redis_client.xpending_range(PROMPTS, "workers", "-", "+", 10)] == [b"b"]


def test_a_renewal_keeps_the_lease_on_every_entry_it_names(redis_client: redis.Redis) -> None:
    """A worker holds a running prompt and one waiting for room: one renewal keeps both, so the other consumer
    reclaims neither past the threshold (a renewal that kept only the first let the waiting prompt run twice)."""
    threshold_ms = 300
    a = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id=f"held{i}", question="q") for i in range(3)])
    held = [d.entry_id for d in a.consume(3)]
    b = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="b")
    stolen: list[Any] = []

    def kept() -> bool:
        assert a.renew(held) == 3
        stolen.extend(b.reclaim(threshold_ms, 10))
        return not stolen

    holds_for(kept, "a renewal keeps every entry it names", 3 * threshold_ms / 1000, threshold_ms / 3000)
    rows = redis_client.xpending_range(PROMPTS, "workers", "-", "+", 10)
    assert [(r["consumer"], r["times_delivered"]) for r in rows] == [(b"a", 1)] * 3


def test_a_reclaim_that_finds_nothing_idle_is_one_round_trip_however_much_is_in_progress(
    redis_client: redis.Redis,
) -> None:
    """A rollout worker looks for abandoned prompts before each one it takes: with a large fleet, a thousand
    prompts in progress, that look must not grow with them (XAUTOCLAIM would scan ten per round trip)."""
    producer = StreamQueue(redis_client, "jobs", common_pb2.PromptTask, group="g")
    producer.ensure_group()
    producer.produce([common_pb2.PromptTask(id=f"t{i}", question="q") for i in range(1000)])
    busy = StreamQueue(redis_client, "jobs", common_pb2.PromptTask, group="g", consumer="busy")
    assert len(busy.consume(1000)) == 1000
    looker = StreamQueue(redis_client, "jobs", common_pb2.PromptTask, group="g", consumer="looker")
    assert looker.reclaim(min_idle_ms=600_000, count=1) == []  # the script loaded into Redis
    redis_client.config_resetstat()
    assert looker.reclaim(min_idle_ms=600_000, count=1) == []
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in redis_client.info("commandstats").items()}
    calls.pop("config|resetstat", None)
    calls.pop("config", None)  # Redis 6.2 names the CONFIG RESETSTAT just made without its subcommand
    # One round trip (the reclaim script), in which one XPENDING finds nothing idle among the thousand.
    assert calls == {"evalsha": 1, "xpending": 1}, calls
    # One handed back (the last one: behind 999 in progress) is taken at the next look, its deliveries counted
    # as before.
    entry = redis_client.xpending_range("jobs", "g", min="-", max="+", count=1000)[-1]["message_id"].decode()
    busy.hand_back([entry], leave=False)
    taken = looker.reclaim(min_idle_ms=600_000, count=1)
    assert [(d.entry_id, d.message.id, d.deliveries) for d in taken] == [(entry, "t999", 1)]


class Interleaved(redis.Redis):
    """A client through which another process acts (``between``, once) right after this one's first round trip to
    Redis: in the middle of whatever the call makes of more than one."""

    between: Callable[[], object] | None = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)
        finally:
            if (between := self.between) is not None:
                self.between = None
                between()


def interleaved(client: redis.Redis, consumer: str) -> tuple[Interleaved, StreamQueue[common_pb2.PromptTask]]:
    through = Interleaved(connection_pool=client.connection_pool)
    # A script Redis has not loaded costs the call a first round trip (EVALSHA answered NOSCRIPT) before the one
    # that runs it: ``between`` then falls between them, where the call has looked at nothing yet.
    client.script_flush()
    return through, StreamQueue(through, PROMPTS, common_pb2.PromptTask, group="workers", consumer=consumer)


def pending_under(client: redis.Redis) -> dict[str, str]:
    return {r["message_id"].decode(): r["consumer"].decode()
            for r in client.xpending_range(PROMPTS, "workers", "-", "+", 100)}


def test_an_entry_reclaimed_by_another_consumer_during_a_hand_back_stays_with_it_and_runs_no_third_time(
    redis_client: redis.Redis,
) -> None:
    """A consumer paused past the reclaim threshold hands back what it holds just as another consumer reclaims one
    of those entries. The hand-back moves only what is still its own: the entry the other took stays with it (a
    hand-back that read its list first and moved it after put it out for a third run), and its own goes back."""
    threshold_ms = 1000
    through, a = interleaved(redis_client, "a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id="slow", question="q")])
    (slow,) = a.consume(1)
    time.sleep(threshold_ms * 1.2 / 1000)  # a stopped renewing its lease on it (paused)
    a.produce([common_pb2.PromptTask(id="fresh", question="q")])
    (fresh,) = a.consume(1)
    b = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="b")
    stolen: list[Any] = []
    through.between = lambda: stolen.extend(b.reclaim(threshold_ms, 10))
    handed = a.hand_back(leave=False)
    assert [(d.message.id, d.deliveries) for d in stolen] == [("slow", 2)]  # b took it in the middle: its 2nd run
    assert handed == 1  # a's own entry only
    assert pending_under(redis_client) == {slow.entry_id: "b", fresh.entry_id: HANDED_BACK}
    c = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="c")
    assert [(d.message.id, d.deliveries) for d in c.reclaim(threshold_ms, 10)] == [("fresh", 1)]
    assert pending_under(redis_client) == {slow.entry_id: "b", fresh.entry_id: "c"}
    # Nor does a retry of it, nor a hand-back naming it, take it from b.
    assert a.retry([slow.entry_id], backoff_ms=0) == 0 and a.hand_back([slow.entry_id], leave=False) == 0
    assert pending_under(redis_client) == {slow.entry_id: "b", fresh.entry_id: "c"}


def test_a_consumer_that_leaves_hands_back_an_entry_delivered_to_it_while_it_left(redis_client: redis.Redis) -> None:
    """A worker leaves as a prompt is delivered to it (its taking and its leaving cross): the entry goes back with
    the others. A leave that listed its entries, then removed the consumer (XGROUP DELCONSUMER drops what it
    holds), lost an entry delivered in between: neither pending nor waiting, never delivered again."""
    through, a = interleaved(redis_client, "a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id="held", question="q"), common_pb2.PromptTask(id="late", question="q")])
    (held,) = a.consume(1)
    taking = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="a")
    late: list[Any] = []
    through.between = lambda: late.extend(taking.consume(1))
    handed = a.hand_back()
    assert [d.message.id for d in late] == ["late"]  # delivered to a in the middle of its leaving
    assert handed == 2
    assert [c["name"] for c in redis_client.xinfo_consumers(PROMPTS, "workers")] == [HANDED_BACK.encode()]
    assert a.backlog() == Backlog(waiting=2, in_progress=0, holders=0)
    b = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="b")
    assert [(d.message.id, d.deliveries) for d in b.reclaim(600_000, 10)] == [("held", 1), ("late", 1)]
    assert pending_under(redis_client) == {held.entry_id: "b", late[0].entry_id: "b"}


def test_a_hand_back_is_one_round_trip_so_nothing_comes_between_its_look_and_its_moves(
    redis_client: redis.Redis,
) -> None:
    """Handing back, retrying and leaving each look at what the consumer holds and move it in one script."""
    a = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="workers", consumer="a")
    a.ensure_group()
    a.produce([common_pb2.PromptTask(id=f"t{i}", question="q") for i in range(4)])
    first, second, _, _ = a.consume(4)
    assert a.hand_back([first.entry_id], leave=False) == 1  # the script loaded into Redis

    def commands(call: Callable[[], int], moved: int) -> set[str]:
        redis_client.config_resetstat()
        assert call() == moved
        calls = {k.removeprefix("cmdstat_").split("|")[0]: v["calls"]
                 for k, v in redis_client.info("commandstats").items()}
        calls.pop("config", None)
        assert calls.pop("evalsha") == 1, calls  # the one round trip; the rest ran inside it
        return set(calls)

    assert commands(lambda: a.retry([second.entry_id], backoff_ms=0), 1) == {"xpending", "xclaim"}
    assert commands(a.hand_back, 2) == {"xpending", "xclaim", "xgroup"}
    assert [c["name"] for c in redis_client.xinfo_consumers(PROMPTS, "workers")] == [HANDED_BACK.encode()]
