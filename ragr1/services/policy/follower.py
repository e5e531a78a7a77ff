"""A rollout worker's weights: the newest version the trainer announced in Redis, loaded when the worker starts,
before it takes a prompt, and each later one as it is announced; and the replica's report to the fleet.

Loads go through ``Policy.update_weights`` (the version fence: in-flight rollouts finish or abort, every
rollout carries one version) with the announced digest, checked before anything is loaded. A version that
cannot be loaded (digest mismatch, a checkpoint that does not match the served model, an engine that fails
to load it) is refused: the replica says why in its log and its report, takes no more prompts and turns its
gRPC health NOT_SERVING, until a later announced version loads. The other replicas are not concerned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis

from ragr1.services.common import fleet
from ragr1.services.common.errors import ServiceError
from ragr1.services.policy.runtime import Policy

log = logging.getLogger(__name__)

T = TypeVar("T")

# A report outlives this many heartbeats that did not come: a replica paused that long has left the fleet.
REPORT_HEARTBEATS = 3
# Longest blocking read of the announcements; a stop waits at most this long for it.
_WAKE_MS = 1000
_RETRY_SECONDS = 1.0


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except OSError:  # a path the filesystem refuses: the checkpoint check names it
        return True


class WeightFollower:
    """``accepting`` is set while the worker may take prompts: after the start-up load, cleared while the
    newest version is refused. ``set_serving`` is the server's health switch."""

    def __init__(
        self,
        policy: Policy,
        client: redis.Redis,
        name: str,
        *,
        heartbeat_seconds: float,
        checkpoint_wait_seconds: float,
        set_serving: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.policy = policy
        self.redis = client
        self.name = name
        self.heartbeat_seconds = heartbeat_seconds
        self.checkpoint_wait_seconds = checkpoint_wait_seconds
        self.set_serving = set_serving
        self.accepting = asyncio.Event()
        self.state = fleet.STARTING
        self.target = 0
        self.reason = ""
        self._seen = "0-0"  # the last announcement read (a stream entry id)
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
        if stop.is_set():
            return
        if newest is None:
            log.info("no weight version announced yet: serving the starting weights as v%d", self.policy.gate.version)
        else:
            await self.take(newest)
        if self.state == fleet.STARTING:
            await self._serve()
        while not stop.is_set():
            newest = await self._ask(stop, lambda client: fleet.next_after(client, self._seen, _WAKE_MS))
            if newest is not None:
                await self.take(newest)

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
                await asyncio.wait_for(done.wait(), self.heartbeat_seconds)

    async def _report(self) -> None:
        async with self._reporting:
            try:
                await asyncio.to_thread(fleet.report, self.redis, self.report(),
                                        REPORT_HEARTBEATS * self.heartbeat_seconds)
            except Exception as exc:
                log.warning("reporting to the fleet failed: %s: %s", type(exc).__name__, exc)

    # -- one announcement -----------------------------------------------------------------------
    async def take(self, announced: fleet.Announcement) -> None:
        """Loads ``announced`` unless it is not newer than what is served, or was refused already."""
        self._seen = announced.entry_id or self._seen
        if announced.version <= self.policy.gate.version:
            return
        if self.state == fleet.REFUSED and announced.version <= self.target:
            return
        self.state, self.target, self.reason = fleet.LOADING, announced.version, ""
        await self._report()
        try:
            await self._wait_for(announced.path)
            await self.policy.update_weights(announced.version, announced.path, sha256=announced.sha256)
        except Exception as exc:
            # An UpdateWeights call that loaded a version as new while this waited is no refusal.
            if self.policy.gate.version < announced.version:
                await self._refuse(announced, _reason(exc))
                return
        await self._serve()

    async def _wait_for(self, path: str) -> None:
        """Shared storage may show a directory to another host later than the trainer wrote it."""
        deadline = time.monotonic() + self.checkpoint_wait_seconds
        if await asyncio.to_thread(_is_dir, path) or self.checkpoint_wait_seconds <= 0:
            return
        log.info("waiting up to %.0f s for the announced checkpoint %s to appear", self.checkpoint_wait_seconds, path)
        while time.monotonic() < deadline and not await asyncio.to_thread(_is_dir, path):
            await asyncio.sleep(_RETRY_SECONDS)

    async def _serve(self) -> None:
        self.state, self.target, self.reason = fleet.SERVING, 0, ""
        await self._report()
        if not self.accepting.is_set():
            await self.set_serving(True)
            self.accepting.set()

    async def _refuse(self, announced: fleet.Announcement, reason: str) -> None:
        log.error("weights v%d refused: %s; this replica serves v%d, takes no prompts and reports NOT_SERVING "
                  "until a later version loads", announced.version, reason, self.policy.gate.version)
        self.state, self.target, self.reason = fleet.REFUSED, announced.version, reason
        self.accepting.clear()
        await self.set_serving(False)
        await self._report()

