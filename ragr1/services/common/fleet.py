"""The weight versions of a training run and the policy replicas that follow them, in Redis.

The trainer announces each version it publishes once, as an entry of the stream ``ragr1:weights`` (version,
the checkpoint's directory on storage every replica reads, its content digest); the newest entry is the
version a replica must serve. A stream rather than a message: a replica that was down when a version was
announced finds it when it comes back (the stream's last entry), and a running one blocks on the stream to
hear of the next at once. The stream keeps its last ``ANNOUNCEMENTS_KEPT`` entries: the history is for
operators, only the last entry counts.

Each replica reports itself under ``ragr1:replicas:<name>`` (its served version and state, as JSON) with a
time-to-live a few of its heartbeats long, so that a replica that died or was scaled away leaves the fleet
by itself; the set ``ragr1:replicas`` names the replicas that reported, so that the trainer finds them
without scanning every key of Redis (which holds a done mark per message).

These key names are used nowhere else; the trainer (``publisher``) and the policy (``follower``) both
read and write through this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import redis

from ragr1.services.common.hashing import checkpoint_files, checkpoint_sha256

WEIGHTS = "ragr1:weights"
REPLICAS = "ragr1:replicas"
ANNOUNCEMENTS_KEPT = 100

# What a replica reports: starting (no version looked up yet), loading (a newer version on its way in),
# serving (taking prompts), refused (the newest version could not be loaded: no prompts, NOT_SERVING).
STARTING, LOADING, SERVING, REFUSED = "starting", "loading", "serving", "refused"
STATES = (STARTING, LOADING, SERVING, REFUSED)
# States in which a replica makes rollouts with the version it serves: serving, or loading a newer one while the
# rollouts it holds finish on the old weights. Only a serving replica takes prompts (``ReplicaReport.takes_prompts``):
# a loading one takes none until the load is done, and a refused one goes back to loading at each retry.
GENERATING = (SERVING, LOADING)

# Appends an announcement unless the stream's last one is of this version or a newer one, in one step, so
# that a version is announced once however often the trainer asks (a retried command, a restart).
# KEYS: the stream. ARGV: version, entries kept, then field, value pairs.
_ANNOUNCE = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last > 0 then
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'version' and tonumber(fields[i + 1]) >= tonumber(ARGV[1]) then return 0 end
  end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
return 1
"""


def wanted_replicas(waiting: int, in_progress: int, holders: int, prompts_per_replica: int) -> int:
    """The replicas the fleet's autoscaler asks for, as Kubernetes computes it from the chart's two KEDA
    triggers (the largest of them: ``deploy/helm/ragr1/templates/autoscaling.yaml``): enough replicas for every
    prompt waiting or in progress at ``prompts_per_replica`` each, and never fewer than the replicas holding
    prompts in progress, so that a scale-down never takes work from a busy replica while an idle one could
    go. Any prompt at all asks for one replica, which wakes a fleet at zero."""
    if prompts_per_replica < 1:
        raise ValueError(f"prompts_per_replica must be at least 1, got {prompts_per_replica}")
    return max(math.ceil((waiting + in_progress) / prompts_per_replica), holders)


def replica_key(name: str) -> str:
    return f"{REPLICAS}:{name}"


def _text(value: bytes | str) -> str:
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else value


@dataclasses.dataclass(frozen=True)
class Announcement:
    """A published weight version: ``path`` is the checkpoint directory as every replica sees it, ``sha256``
    its digest (``hashing.checkpoint_sha256``), ``files`` every file of it with its size
    (``hashing.checkpoint_files``; empty in announcements written before they were listed): the manifest by
    which a replica on shared storage that shows files late or half-copied knows when the checkpoint is
    complete. ``entry_id`` is the stream entry, once read back."""

    version: int
    path: str
    sha256: str
    files: dict[str, int] = dataclasses.field(default_factory=dict)
    at: float = 0.0
    entry_id: str = ""

    def fields(self) -> dict[str, str]:
        return {"version": str(self.version), "path": self.path, "sha256": self.sha256,
                "files": json.dumps(self.files, sort_keys=True), "at": f"{self.at:.3f}"}

    @classmethod
    def read(cls, entry_id: Any, fields: dict[Any, Any]) -> Announcement:
        """Raises ValueError for an entry that is not an announcement (written by hand, say)."""
        values = {_text(k): _text(v) for k, v in fields.items()}
        try:
            files = json.loads(values.get("files", "{}"))
            if not isinstance(files, dict):
                raise ValueError("files is not an object")
            return cls(int(values["version"]), values["path"], values["sha256"],
                       {str(k): int(v) for k, v in files.items()}, float(values.get("at", 0.0)), _text(entry_id))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{WEIGHTS} entry {_text(entry_id)} is not a weight announcement: {values}") from exc


def announce(client: redis.Redis, version: int, path: str, sha256: str, files: dict[str, int] | None = None) -> bool:
    """Announces ``version``; False (and nothing written) when it or a newer one is announced already."""
    fields = Announcement(version, path, sha256, dict(files or {}), time.time()).fields()
    script = client.register_script(_ANNOUNCE)
    args: list[str | int] = [version, ANNOUNCEMENTS_KEPT, *[x for pair in fields.items() for x in pair]]
    return bool(script(keys=[WEIGHTS], args=args))


def announce_checkpoint(client: redis.Redis, version: int, path: Path, sha256: str = "") -> bool:
    """Announces the checkpoint directory ``path`` (as every replica sees it) as ``version``, with the list of
    its files and its digest (computed unless given: seconds per GB); see ``announce``."""
    return announce(client, version, str(path), sha256 or checkpoint_sha256(path), checkpoint_files(path))


def latest(client: redis.Redis) -> Announcement | None:
    """The newest announced version, or None before the first."""
    reply: Any = client.xrevrange(WEIGHTS, count=1)
    return Announcement.read(*reply[0]) if reply else None


def next_after(client: redis.Redis, entry_id: str, block_ms: int) -> Announcement | None:
    """Waits up to ``block_ms`` for an announcement after the stream entry ``entry_id`` ("0-0": any); returns
    the newest one then (versions announced meanwhile are skipped: only the newest is worth loading)."""
    reply: Any = client.xread({WEIGHTS: entry_id}, count=1, block=block_ms)
    return latest(client) if reply else None


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """One replica as it reports itself: ``version`` the weights it serves; ``target`` the version it is
    loading or refused (0: none); ``reason`` why it refused."""

    name: str
    version: int
    state: str
    target: int = 0
    reason: str = ""
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"replica state must be one of {', '.join(STATES)}, got {self.state!r}")

    @property
    def generating(self) -> bool:
        return self.state in GENERATING

    @property
    def takes_prompts(self) -> bool:
        return self.state == SERVING

    def describe(self) -> str:
        if self.state == REFUSED:
            return f"{self.name} serves v{self.version}, refused v{self.target}: {self.reason}"
        if self.state == LOADING:
            return f"{self.name} serves v{self.version}, loading v{self.target}"
        return f"{self.name} {self.state} v{self.version}"


def report(client: redis.Redis, replica: ReplicaReport, ttl_seconds: float) -> None:
    """Writes the replica's report, which expires after ``ttl_seconds`` unless written again."""
    pipe = client.pipeline(transaction=True)
    pipe.set(replica_key(replica.name), json.dumps(dataclasses.asdict(replica)), px=max(1, int(ttl_seconds * 1000)))
    pipe.sadd(REPLICAS, replica.name)
    pipe.execute()


def withdraw(client: redis.Redis, name: str) -> None:
    """Takes a replica out of the fleet at once (it stops), rather than when its report expires."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(replica_key(name))
    pipe.srem(REPLICAS, name)
    pipe.execute()


def replicas(client: redis.Redis) -> list[ReplicaReport]:
    """The replicas whose reports have not expired, by name; the names of expired ones leave the set."""
    members: Any = client.smembers(REPLICAS)
    names = sorted(_text(n) for n in members)
    if not names:
        return []
    values: Any = client.mget([replica_key(n) for n in names])
    out, gone = [], []
    for name, value in zip(names, values, strict=True):
        if value is None:
            gone.append(name)
            continue
        try:
            out.append(ReplicaReport(**json.loads(value)))
        except (TypeError, ValueError):  # a report from another version of the code: not counted
            continue
    if gone:
        # A replica that reports again in between adds its name back at its next heartbeat.
        client.srem(REPLICAS, *gone)
    return out
