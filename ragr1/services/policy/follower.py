"""A rollout worker's weights: the versions the trainer announces in Redis, the starting weights included; and
the replica's report to the fleet.

A replica takes prompts only while it serves the newest announced version: at start it takes none until it has
loaded that version (or found that its own model is it: the same digest), and it turns its gRPC health SERVING
only then (with nothing announced yet, its own model is all it can serve: SERVING, but no prompts until the
trainer announces). Loads go through ``Policy.update_weights`` (the version fence: in-flight rollouts finish or
abort, every rollout carries one version) with the announced digest, checked before anything is loaded.

From the moment a newer version is announced until it serves (its checkpoint waited for, its digest read, the
load), the replica takes no prompt and starts no trajectory (``VersionGate.holding``): what it starts would be
stale on arrival. Running trajectories finish or abort as ``on_weight_update`` says.

Shared storage may show a checkpoint late or half-copied: an announcement lists every file with its size, and
a version is loaded only once all of them are there (then its digest decides), waited for with backoff up to
``checkpoint_wait_seconds`` while no newer version is announced. A version that still cannot be loaded is
refused: the replica says why in its log and its report, takes no prompts and turns NOT_SERVING, and tries it
again every ``refusal_retry_seconds`` until it, or a later version, loads. The other replicas are not concerned.
A load that failed in the engine through an ``UpdateWeights`` call rather than the follower leaves the weights
unknown just the same: the replica refuses, and loads the newest announced version again after
``refusal_retry_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis

from ragr1.services.common import fleet
from ragr1.services.common.config import Validated, setting
from ragr1.services.common.errors import FailedPrecondition, ServiceError
from ragr1.services.common.hashing import missing_files
from ragr1.services.common.streams import entry_key
from ragr1.services.policy.runtime import Policy

log = logging.getLogger(__name__)

T = TypeVar("T")

# A report outlives this many heartbeats that did not come: a replica paused that long has left the fleet.
REPORT_HEARTBEATS = 3
# Longest blocking read of the announcements; a stop waits at most this long for it.
_WAKE_MS = 1000
_RETRY_SECONDS = 1.0
# Backoff between looks at a checkpoint that is not complete yet: from the first to the last, doubling.
_FIRST_LOOK_SECONDS, _LAST_LOOK_SECONDS = 0.25, 5.0


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"


def incomplete(announced: fleet.Announcement) -> str:
    """What the announced checkpoint lacks on this replica's storage, named; "" when it is all there."""
    path = Path(announced.path)
    try:
        if not path.is_dir():
            return f"checkpoint {path} does not exist (yet)"
    except OSError:  # a path the filesystem refuses: the checkpoint check names it
        return ""
    return missing_files(path, announced.files)


@dataclasses.dataclass
class FollowerSettings(Validated):
    """How a rollout worker follows the weight versions the trainer announces in Redis (common/fleet.py). The
    policy's config takes each of these definitions (``same_as``) and gives the follower this object whole
    (``PolicyConfig.follower_settings``)."""

    heartbeat_seconds: float = setting(
        5.0, "how often a rollout worker reports its weight version and state in Redis (the report expires "
        "after three of these without one)"
    )
    checkpoint_wait_seconds: float = setting(
        60.0, "how long an announced checkpoint that is not complete yet (shared storage that shows new files "
        "late or half-copied) is waited for before the version is refused"
    )
    refusal_retry_seconds: float = setting(
        60.0, "a refused weight version is tried again after this long, until it or a later one loads"
    )

    def validate(self) -> None:
        super().validate()
        for name in ("heartbeat_seconds", "refusal_retry_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.checkpoint_wait_seconds < 0:
            raise ValueError(f"checkpoint_wait_seconds must be at least 0, got {self.checkpoint_wait_seconds}")


class WeightFollower:
    """``accepting`` is set while the worker may take prompts: while the replica serves the newest announced
    version. ``set_serving`` is the server's health switch."""

    def __init__(
        self,
        policy: Policy,
        client: redis.Redis,
        name: str,
        settings: FollowerSettings,
        *,
        set_serving: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.policy = policy
        self.redis = client
        self.name = name
        self.settings = settings
        self.set_serving = set_serving
        self.accepting = asyncio.Event()
        self.state = fleet.STARTING
        self.target = 0
        self.reason = ""
        self._seen = "0-0"  # the last announcement read (a stream entry id)
        self._announced: fleet.Announcement | None = None  # the newest announcement taken
        self._ready = False  # the server's readiness as this follower last set it
        self._refused: fleet.Announcement | None = None
        self._retry_at = 0.0
        self._reporting = asyncio.Lock()

    def report(self) -> fleet.ReplicaReport:
        return fleet.ReplicaReport(self.name, self.policy.gate.version, self.state, self.target, self.reason,
                                   time.time())

    # -- the job --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Follows the announcements until ``stop``, reporting every ``heartbeat_seconds``; then leaves the
        fleet."""
        done = asyncio.Event()
        heartbeats = asyncio.ensure_future(self._heartbeats(done))
        try:
            await self._follow(stop)
        finally:
            done.set()
            await heartbeats
            with contextlib.suppress(Exception):  # a Redis that is down: the report expires by itself
                await asyncio.to_thread(fleet.withdraw, self.redis, self.name)

    async def _follow(self, stop: asyncio.Event) -> None:
        newest = await self._ask(stop, fleet.latest)
        if newest is None and not stop.is_set():
            log.info("no weight version announced yet: serving the starting weights as v%d to calls, taking no "
                     "prompt until the trainer announces a version", self.policy.gate.version)
            await self._set_ready(True)
        while not stop.is_set():
            await self._check_gate()
            if newest is None and self._refused is not None and time.monotonic() >= self._retry_at:
                log.info("trying the refused weights v%d again", self._refused.version)
                newest = self._refused
            if newest is not None:
                await self.take(newest, stop)
            newest = await self._ask(stop, lambda client: fleet.next_after(client, self._seen, _WAKE_MS))

    async def _ask(self, stop: asyncio.Event, call: Callable[[redis.Redis], T]) -> T | None:
        """``call(redis)`` in a thread, retried while it fails (Redis down, after the client's own retries)."""
        while not stop.is_set():
            try:
                return await asyncio.to_thread(call, self.redis)
            except Exception as exc:
                log.warning("reading the weight announcements failed (%s: %s); again in %.0f s",
                            type(exc).__name__, exc, _RETRY_SECONDS)
                await asyncio.sleep(_RETRY_SECONDS)
        return None

    async def _heartbeats(self, done: asyncio.Event) -> None:
        while not done.is_set():
            await self._report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.settings.heartbeat_seconds)

    async def _report(self) -> None:
        async with self._reporting:
            try:
                await asyncio.to_thread(fleet.report, self.redis, self.report(),
                                        REPORT_HEARTBEATS * self.settings.heartbeat_seconds)
            except Exception as exc:
                log.warning("reporting to the fleet failed: %s: %s", type(exc).__name__, exc)

    # -- one announcement -----------------------------------------------------------------------
    async def take(self, announced: fleet.Announcement, stop: asyncio.Event | None = None) -> None:
        """Serves ``announced`` (loading it unless it is what is served), or a newer version announced while
        its checkpoint was waited for; refuses it when it cannot be loaded in time. No trajectory starts while a
        load is readied and made."""
        self._seen = max(self._seen, announced.entry_id or self._seen, key=entry_key)
        self._announced = announced
        if await self._serves(announced):
            if self.state != fleet.SERVING or not self.accepting.is_set():
                await self._serve()
            return
        async with self.policy.gate.holding():
            current: fleet.Announcement | None = announced
            while current is not None and not (stop is not None and stop.is_set()):
                current = await self._take_one(current, stop)

    async def _check_gate(self) -> None:
        """Reflects a load that failed in the engine outside this follower (an ``UpdateWeights`` call): the
        weights are unknown, so the replica refuses (NOT_SERVING, no prompts) until a load succeeds; the newest
        announced version is loaded again after ``refusal_retry_seconds``. With nothing announced, a later call
        whose load succeeded makes it ready for calls again."""
        failed = self.policy.gate.failed
        if failed and self.state != fleet.REFUSED:
            await self._refuse(self._announced, f"a weight update failed in the engine: {failed}")
        elif not failed and self.state == fleet.REFUSED and self._announced is None:
            log.info("the engine's weights are known again (v%d): ready for calls, taking no prompt until the "
                     "trainer announces a version", self.policy.gate.version)
            self.state, self.target, self.reason = fleet.STARTING, 0, ""
            await self._set_ready(True)
            await self._report()

    async def _serves(self, announced: fleet.Announcement) -> bool:
        """Whether the served weights are ``announced``'s (or newer): at the same version, by digest."""
        gate = self.policy.gate
        if gate.failed or announced.version > gate.version:
            return False
        if announced.version < gate.version:
            return True
        try:
            return (await self.policy.served_checkpoint())[2] == announced.sha256
        except OSError:
            return False

    async def _take_one(self, announced: fleet.Announcement, stop: asyncio.Event | None) -> fleet.Announcement | None:
        """Loads ``announced``; returns a newer announcement to take instead, or None when done."""
        if await self._serves(announced):
            if self.state != fleet.SERVING or not self.accepting.is_set():
                await self._serve()
            return None
        self.state, self.target, self.reason = fleet.LOADING, announced.version, ""
        self.accepting.clear()
        await self._report()
        deadline = time.monotonic() + self.settings.checkpoint_wait_seconds
        pause = _FIRST_LOOK_SECONDS
        waiting_said = False
        while True:
            problem = await asyncio.to_thread(incomplete, announced)
            if not problem:
                try:
                    await self.policy.update_weights(announced.version, announced.path, sha256=announced.sha256,
                                                     same_version=True)
                    await self._serve()
                    return None
                except FailedPrecondition as exc:  # not the announced weights yet (half-copied), or never
                    problem = str(exc)
                except Exception as exc:  # the engine failed to load it: nothing runs until a load succeeds
                    if await self._serves(announced):  # an UpdateWeights call loaded it meanwhile
                        await self._serve()
                        return None
                    await self._refuse(announced, _reason(exc))
                    return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                await self._refuse(announced, problem)
                return None
            if not waiting_said:
                log.info("weights v%d: waiting up to %.0f s for the checkpoint to be complete: %s",
                         announced.version, remaining, problem)
                waiting_said = True
            await asyncio.sleep(min(pause, remaining))
            pause = min(2 * pause, _LAST_LOOK_SECONDS)
            newer = await self._ask(stop or asyncio.Event(), fleet.latest)
            if newer is not None and newer.version > announced.version:
                log.info("weights v%d announced while v%d was waited for: loading v%d instead",
                         newer.version, announced.version, newer.version)
                self._seen = max(self._seen, newer.entry_id, key=entry_key)
                self._announced = newer
                return newer

    async def _set_ready(self, ready: bool) -> None:
        self._ready = ready
        await self.set_serving(ready)

    async def _serve(self) -> None:
        self.state, self.target, self.reason = fleet.SERVING, 0, ""
        self._refused = None
        await self._report()
        if not self._ready:
            await self._set_ready(True)
        self.accepting.set()

    async def _refuse(self, announced: fleet.Announcement | None, reason: str) -> None:
        """Takes no prompts and turns NOT_SERVING; ``announced`` (if any) is tried again after
        ``refusal_retry_seconds``."""
        if announced is None:
            log.error("%s; this replica takes no prompts and reports NOT_SERVING until a load succeeds", reason)
        else:
            log.error("weights v%d refused: %s; this replica serves v%d, takes no prompts and reports NOT_SERVING "
                      "until a version loads (v%d tried again in %.0f s)", announced.version, reason,
                      self.policy.gate.version, announced.version, self.settings.refusal_retry_seconds)
        self.state, self.target, self.reason = fleet.REFUSED, announced.version if announced else 0, reason
        self._refused, self._retry_at = announced, time.monotonic() + self.settings.refusal_retry_seconds
        self.accepting.clear()
        await self._set_ready(False)
        await self._report()
