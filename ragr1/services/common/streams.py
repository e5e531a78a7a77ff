"""The Redis Streams queue between the trainer and the rollout workers.

Two streams carry protobuf payloads from ``proto/``: ``prompts`` (``PromptTask``) and ``rollouts``
(``Rollout``). Delivery is at-least-once through consumer groups; the consumer acknowledges only
after its work is durable, and can put its own writes into the same transaction as the
acknowledgement (``ack(..., also=...)``), so that handing a message on and acknowledging it happen
together or not at all. Entries whose consumer died are reclaimed after an idle time; an entry
delivered more than ``max_deliveries`` times, or one that does not parse or validate, goes to the
dead-letter stream ``<stream>:dead`` with the reason; messages whose ``id`` was already acknowledged
are skipped (de-duplication by message id, e.g. a producer that retried).

Reclaim is for the dead only. A live consumer keeps its lease on what it works on (``renew``: its own entries
re-claimed, which resets their idle time), however long the work takes; work it will not finish goes back at
once (``hand_back``: a consumer that leaves), and work that failed for a passing reason goes back at once with a
delivery counted, to be taken again after a backoff (``retry``). Redis Streams have no negative
acknowledgement: both park the entry under the consumer name ``HANDED_BACK`` with an idle time that says when it
is due, and ``reclaim`` takes an entry parked there once it is due, whatever its own idle threshold.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import redis
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from ragr1.services.common import ports, stream_scripts
from ragr1.services.common.config import Validated, setting
from ragr1.services.common.redis_client import RedisTLS, connect

log = logging.getLogger(__name__)

PROMPTS = "prompts"
ROLLOUTS = "rollouts"
DEAD_LETTER_SUFFIX = ":dead"
# The rollout workers' consumer group on the prompts stream (``QueueConfig.worker_group``'s default).
WORKERS = "rollout-workers"
# The consumer that entries handed back are parked under (``hand_back``, ``retry``): no process reads under this
# name; ``reclaim`` takes each of them once it is due. Its entries are waiting work, not work in progress
# (``Backlog``).
HANDED_BACK = "handed-back"
# The idle time at which an entry parked under HANDED_BACK is due: larger than any reclaim threshold (about 30
# years), smaller than the time since the epoch, which Redis subtracts it from. An entry handed back to be taken
# at once is parked this idle; one to be taken after a backoff, this less the backoff (so due when it has passed).
_HANDED_BACK_IDLE_MS = 10**12
# The longest backoff ``retry`` accepts: the parked entries' idle times stay far above any reclaim threshold.
MAX_BACKOFF_MS = 24 * 3600 * 1000

STREAM_EVENTS = Counter(
    "ragr1_queue_events_total",
    "Queue events by stream and kind (produced, delivered, acked, duplicate, reclaimed, handed_back, retried: handed "
    "back after a passing failure, dead_lettered, trimmed).",
    ["stream", "event"],
)


class Payload(Protocol):
    id: str

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


M = TypeVar("M", bound=Payload)


@dataclasses.dataclass(frozen=True)
class Backlog:
    """The work of a consumer group: ``waiting`` entries no consumer works on (never delivered, or handed
    back), ``in_progress`` entries delivered to a consumer and not acknowledged yet, and ``holders`` the
    consumers holding at least one of those."""

    waiting: int
    in_progress: int
    holders: int


@dataclasses.dataclass
class Delivery(Generic[M]):
    """One message handed to a consumer. ``deliveries`` counts this one."""

    entry_id: str
    message: M
    deliveries: int = 1


@dataclasses.dataclass
class QueueConfig(Validated):
    """The settings of a service that uses the queue (the rollout workers, the trainer)."""

    help_group: ClassVar[str] = "redis"

    redis_url: str = setting(ports.REDIS_URL, "Redis of the prompts and rollouts streams (rediss:// for TLS)")
    worker_group: str = setting(WORKERS, "the rollout workers' consumer group on the prompts stream")
    redis_password_file: str = setting("", "file holding the Redis password (AUTH on if set)")
    redis_ca_file: str = setting("", "PEM CA of the Redis server's certificate (with a rediss:// URL)")
    redis_cert_file: str = setting("", "PEM client certificate, for a Redis that requires one")
    redis_key_file: str = setting("", "PEM private key of redis_cert_file")

    def validate(self) -> None:
        super().validate()
        self.redis_tls().check(self.redis_url)

    def redis_tls(self) -> RedisTLS:
        return RedisTLS(self.redis_ca_file, self.redis_cert_file, self.redis_key_file)

    def redis_client(self) -> redis.Redis:
        return connect(self.redis_url, self.redis_password_file, self.redis_tls())


def _text(value: bytes | str) -> str:
    # Anyone with access can write any bytes to a stream: a field that is not UTF-8 must reach the dead
    # letters with its reason, not crash the consumer at every restart (found by fuzzing).
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else value


class StreamQueue(Generic[M]):
    """A consumer group on one stream, for one consumer name (or a producer: ``consumer=""``)."""

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        message_type: type[M],
        *,
        group: str,
        consumer: str = "",
        max_deliveries: int = 5,
        done_ttl_seconds: int = 7 * 24 * 3600,
        validate: Callable[[M], str | None] | None = None,
    ) -> None:
        # redis-py annotates every command as sync-or-async; the replies are used as documented.
        self.redis: Any = client
        self.stream = stream
        self.dead_stream = stream + DEAD_LETTER_SUFFIX
        self.message_type = message_type
        self.group = group
        self.consumer = consumer
        self.max_deliveries = max_deliveries
        self.done_ttl_seconds = done_ttl_seconds
        self.validate = validate

    # -- set-up ---------------------------------------------------------------------------------
    def ensure_group(self) -> None:
        """Creates the stream and the group (reading from the start) if they do not exist."""
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _done_key(self, message_id: str) -> str:
        return f"ragr1:done:{self.stream}:{self.group}:{message_id}"

    # -- producing ------------------------------------------------------------------------------
    def produce(self, messages: Iterable[M], pipe: Any = None, *, producer: str = "") -> int:
        """Appends messages; inside ``pipe`` (a transaction) when given, else at once. ``producer`` (a rollout
        worker's consumer name) goes into each entry beside the message, so that an audit of the stream sees
        which replica made what."""
        target = pipe if pipe is not None else self.redis.pipeline(transaction=False)
        count = 0
        for message in messages:
            if not message.id:
                raise ValueError(f"{type(message).__name__} without an id cannot be queued")
            fields = {"id": message.id, "data": message.SerializeToString()}
            if producer:
                fields["producer"] = producer
            target.xadd(self.stream, fields)
            count += 1
        if pipe is None:
            target.execute()
        STREAM_EVENTS.labels(self.stream, "produced").inc(count)
        return count

    # -- consuming ------------------------------------------------------------------------------
    def consume(self, count: int, block_ms: int | None = None, *, pending: bool = False) -> list[Delivery[M]]:
        """Up to ``count`` new messages (waits up to ``block_ms`` for the first).

        ``pending=True`` re-reads this consumer's own delivered-but-unacknowledged entries instead,
        which is how a restarted consumer with the same name resumes.
        """
        reply = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: "0" if pending else ">"}, count=count, block=block_ms
        )
        entries = [(eid, fields) for _stream, items in reply or [] for eid, fields in items]
        counts = self._delivery_counts([_text(e) for e, _ in entries]) if pending else {}
        return self._accept(entries, counts)

    def reclaim(self, min_idle_ms: int, count: int = 100) -> list[Delivery[M]]:
        """Takes over entries left unacknowledged for ``min_idle_ms`` (a dead consumer's: a live one renews what it
        works on) and entries handed back once they are due (``hand_back``: at once; ``retry``: after their
        backoff), whatever ``min_idle_ms``; in entry order, each delivery counted."""
        script = self.redis.register_script(stream_scripts.RECLAIM)
        claimed, owners = script(keys=[self.stream], args=[self.group, self.consumer, min_idle_ms, count,
                                                           HANDED_BACK, _HANDED_BACK_IDLE_MS])
        # A script's reply is Redis's raw one: each entry an id and its fields as a flat list.
        entries = [(e[0], dict(zip(e[1][::2], e[1][1::2], strict=True))) for e in claimed or [] if e and e[1]]
        taken_from: dict[str, int] = {}
        for owner in owners[1::2]:
            taken_from[_text(owner)] = taken_from.get(_text(owner), 0) + 1
        if taken_from:
            # Work whose owner stopped renewing its lease: dead, paused, or lost track of it.
            log.warning("%s: %s took over %s, idle for %d ms or more", self.stream, self.consumer,
                        ", ".join(f"{n} entries from {name}" for name, n in sorted(taken_from.items())), min_idle_ms)
        return self._claimed(entries)

    def renew(self, entry_ids: Sequence[str]) -> int:
        """Keeps this consumer's lease on ``entry_ids``, work it is still doing: their idle time starts again from
        0 (no delivery counted), so that no other consumer's ``reclaim`` takes them however long the work runs. A
        live consumer calls it well within the reclaim threshold; one that stops calling it (dead, paused) loses
        them once they have been idle that long. An entry no longer pending under this consumer (acknowledged,
        handed back, taken by another) is left as it is. Returns how many were renewed."""
        if not entry_ids:
            return 0
        script = self.redis.register_script(stream_scripts.RENEW)
        return int(script(keys=[self.stream], args=[self.group, self.consumer, *entry_ids]))

    def take_over(self, count: int = 1000) -> list[Delivery[M]]:
        """Claims every entry pending under another consumer name of the group, however recently delivered:
        for a group that has one consumer at a time (the trainer), whose successor may come back under a
        new name (a new pod) and must not leave its predecessor's entries pending for good."""
        rows = [r for r in self.redis.xpending_range(self.stream, self.group, min="-", max="+", count=count)
                if _text(r["consumer"]) != self.consumer]
        if not rows:
            return []
        owners = ", ".join(sorted({_text(r["consumer"]) for r in rows}))
        log.warning("%s: taking over %d entries pending under %s", self.stream, len(rows), owners)
        claimed = self.redis.xclaim(self.stream, self.group, self.consumer, 0, [_text(r["message_id"]) for r in rows])
        return self._claimed([(eid, fields) for eid, fields in claimed if fields is not None])

    def hand_back(self, entry_ids: Sequence[str] | None = None, *, leave: bool = True) -> int:
        """Hands entries pending under this consumer (``entry_ids``, or all of them) to the other consumers:
        for work this consumer will not finish. The entries are parked under ``HANDED_BACK``, due at once, so
        whichever consumer next calls ``reclaim`` takes them, rather than after its idle threshold; their
        delivery counts stay as they were (a hand-back is no failed delivery). An entry that is no longer this
        consumer's (another reclaimed it) stays with its owner. ``leave``: every entry still pending under this
        consumer goes back, listed or not, and the consumer is removed from the group (a replica scaled away), in
        the same script, so that nothing delivered to it is dropped with it. Returns how many entries were
        handed back."""
        handed = self._park(entry_ids, counted=False, backoff_ms=0, leave=leave)
        if handed:
            log.info("%s: %s handed back %d entries", self.stream, self.consumer, handed)
            STREAM_EVENTS.labels(self.stream, "handed_back").inc(handed)
        return handed

    def retry(self, entry_ids: Sequence[str], backoff_ms: int) -> int:
        """Hands back entries pending under this consumer whose work failed for a passing reason (a dependency
        restarting, an abort): at once, with the failed delivery counted (so an entry that keeps failing is
        dead-lettered after ``max_deliveries``), to be taken by whichever consumer calls ``reclaim`` once
        ``backoff_ms`` have passed, not after any reclaim threshold. Returns how many entries went back."""
        if not 0 <= backoff_ms <= MAX_BACKOFF_MS:
            raise ValueError(f"backoff_ms must be within 0..{MAX_BACKOFF_MS}, got {backoff_ms}")
        if not entry_ids:
            return 0
        retried = self._park(entry_ids, counted=True, backoff_ms=backoff_ms, leave=False)
        if retried:
            STREAM_EVENTS.labels(self.stream, "retried").inc(retried)
        return retried

    def _park(self, entry_ids: Sequence[str] | None, *, counted: bool, backoff_ms: int, leave: bool) -> int:
        """Moves entries pending under this consumer (``entry_ids``; None or ``leave``: all of them) to
        ``HANDED_BACK``, due after ``backoff_ms``, in one script (``stream_scripts.PARK``: an entry no longer this
        consumer's is left where it is); ``counted``: the delivery they had counts as a failed one (the next
        ``reclaim`` adds one), else it does not; ``leave``: the consumer then leaves the group."""
        which = "leave" if leave else "all" if entry_ids is None else "listed"
        ids = list(entry_ids or []) if which == "listed" else []
        if which == "listed" and not ids:
            return 0
        script = self.redis.register_script(stream_scripts.PARK)
        # XCLAIM counts a delivery unless told the count; the next reclaim counts one more: the real one.
        return int(script(keys=[self.stream], args=[
            self.group, self.consumer, HANDED_BACK, _HANDED_BACK_IDLE_MS - backoff_ms, int(counted), which, *ids,
        ]))

    def _claimed(self, entries: Sequence[tuple[Any, Any]]) -> list[Delivery[M]]:
        """Entries this consumer took from others: counted, then accepted with their delivery counts."""
        if entries:
            STREAM_EVENTS.labels(self.stream, "reclaimed").inc(len(entries))
        return self._accept(entries, self._delivery_counts([_text(e) for e, _ in entries]))

    def _delivery_counts(self, entry_ids: Sequence[str]) -> dict[str, int]:
        if not entry_ids:
            return {}
        wanted = set(entry_ids)
        counts: dict[str, int] = {}
        for row in self.redis.xpending_range(
            self.stream, self.group, min=min(entry_ids, key=entry_key), max=max(entry_ids, key=entry_key),
            count=max(len(entry_ids) * 4, 100), consumername=self.consumer,
        ):
            eid = _text(row["message_id"])
            if eid in wanted:
                counts[eid] = int(row["times_delivered"])
        return counts

    def _accept(self, entries: Sequence[tuple[Any, Any]], counts: dict[str, int]) -> list[Delivery[M]]:
        """Parses, validates and de-duplicates; dead-letters what cannot be served."""
        parsed: list[Delivery[M]] = []
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            fields = {_text(k): v for k, v in fields.items()}
            deliveries = counts.get(entry_id, 1)
            if deliveries > self.max_deliveries:
                self.dead_letter(entry_id, fields, f"delivered {deliveries} times (max {self.max_deliveries})")
                continue
            try:
                message = self.message_type.FromString(fields["data"])  # type: ignore[attr-defined]
            except (KeyError, DecodeError) as exc:
                self.dead_letter(entry_id, fields, f"payload is not a {self.message_type.__name__}: {exc!r}")
                continue
            reason = None if message.id else "message has no id"
            if reason is None and self.validate is not None:
                reason = self.validate(message)
            if reason is not None:
                self.dead_letter(entry_id, fields, reason)
                continue
            parsed.append(Delivery(entry_id, message, deliveries))
        if not parsed:
            return parsed
        done = self.redis.mget([self._done_key(d.message.id) for d in parsed])
        fresh = [d for d, flag in zip(parsed, done, strict=True) if flag is None]
        duplicates = [d.entry_id for d, flag in zip(parsed, done, strict=True) if flag is not None]
        if duplicates:
            self.redis.xack(self.stream, self.group, *duplicates)
            STREAM_EVENTS.labels(self.stream, "duplicate").inc(len(duplicates))
        STREAM_EVENTS.labels(self.stream, "delivered").inc(len(fresh))
        return fresh

    # -- finishing ------------------------------------------------------------------------------
    def ack(
        self, deliveries: Sequence[Delivery[M]], also: Callable[[Any], None] | None = None, *, done: bool = True
    ) -> None:
        """Acknowledges after the work is durable, and marks the message ids done (for de-duplication).
        ``done=False`` only acknowledges: for a second copy of a message whose original is still waiting,
        which must not be skipped as a duplicate if it is re-read after a crash.

        ``also(pipe)`` may add the consumer's own writes (e.g. producing the results to another
        stream); they commit in the same MULTI/EXEC transaction as the acknowledgement.
        """
        pipe = self.redis.pipeline(transaction=True)
        if also is not None:
            also(pipe)
        if deliveries:
            pipe.xack(self.stream, self.group, *[d.entry_id for d in deliveries])
            if done:
                for d in deliveries:
                    pipe.set(self._done_key(d.message.id), 1, ex=self.done_ttl_seconds)
        pipe.execute()
        STREAM_EVENTS.labels(self.stream, "acked").inc(len(deliveries))

    def is_done(self, message_id: str) -> bool:
        return bool(self.redis.exists(self._done_key(message_id)))

    def dead_letter(self, entry_id: str, fields: dict[str, Any], reason: str) -> None:
        """Moves an entry to ``<stream>:dead`` with the reason and acknowledges it, in one transaction."""
        log.warning("dead-lettering %s entry %s: %s", self.stream, entry_id, reason)
        record = {
            "entry_id": entry_id,
            "reason": reason,
            "consumer": self.consumer,
            "at": f"{time.time():.3f}",
            "id": fields.get("id", b""),
            "data": fields.get("data", b""),
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.dead_stream, record)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.execute()
        STREAM_EVENTS.labels(self.stream, "dead_lettered").inc()

    def dead_letters(self, count: int = 1000) -> list[dict[str, str]]:
        """The dead-letter entries (payload left out), oldest first."""
        rows = self.redis.xrange(self.dead_stream, count=count)
        return [
            {_text(k): _text(v) for k, v in fields.items() if _text(k) != "data"} | {"dead_entry_id": _text(eid)}
            for eid, fields in rows
        ]

    def trim(self) -> int:
        """Deletes the entries that every consuming group of the stream is done with (delivered, and
        older than the group's oldest unacknowledged entry); returns how many. A stream keeps every entry
        otherwise, so Redis would grow with every rollout for good (``bench/retriever/soak.py`` measures both). A
        producer's own group (``consumer=""``) reads nothing and is not waited for; with no other group
        nothing is deleted (a group created later reads from the start). Dead letters stay."""
        if not self.redis.exists(self.stream):
            return 0
        groups = self.redis.xinfo_groups(self.stream)
        if not self.consumer:
            groups = [g for g in groups if _text(g["name"]) != self.group]
        if not groups:
            return 0
        bounds = []
        for g in groups:
            ms, seq = entry_key(_text(g["last-delivered-id"]))
            bounds.append((ms, seq + 1))  # everything after the last delivered entry is still to be read
            if int(g["pending"]):
                bounds.append(entry_key(_text(self.redis.xpending(self.stream, g["name"])["min"])))
        ms, seq = min(bounds)
        removed = int(self.redis.xtrim(self.stream, minid=f"{ms}-{seq}", approximate=False))
        STREAM_EVENTS.labels(self.stream, "trimmed").inc(removed)
        return removed

    # -- observing ------------------------------------------------------------------------------
    def depth(self) -> int:
        """Entries in the stream (acknowledged ones included until ``trim``)."""
        return int(self.redis.xlen(self.stream))

    def pending(self) -> int:
        """Entries delivered to the group and not yet acknowledged."""
        return int(self.redis.xpending(self.stream, self.group)["pending"])

    def backlog(self) -> Backlog:
        """The group's waiting and in-progress entries and the consumers holding them (``Backlog``); a group
        that does not exist yet has every entry of the stream waiting."""
        if not self.redis.exists(self.stream):
            return Backlog(0, 0, 0)
        groups = {_text(g["name"]) for g in self.redis.xinfo_groups(self.stream)}
        if self.group not in groups:
            return Backlog(self.depth(), 0, 0)
        summary = self.redis.xpending(self.stream, self.group)
        held = {_text(c["name"]): int(c["pending"]) for c in summary.get("consumers") or []}
        handed = held.pop(HANDED_BACK, 0)
        return Backlog(self.undelivered() + handed, int(summary["pending"]) - handed,
                       sum(1 for n in held.values() if n > 0))

    def undelivered(self) -> int:
        """Entries no consumer of the group has been given yet (Redis 6.2 has no ``lag`` to ask)."""
        groups = {_text(g["name"]): g for g in self.redis.xinfo_groups(self.stream)} if self.depth() else {}
        if self.group not in groups:
            return self.depth()
        last = _text(groups[self.group]["last-delivered-id"])
        return len(self.redis.xrange(self.stream, min=f"({last}", max="+"))


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a pair that sorts as Redis orders entries ("10-0" after "9-5")."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
