"""Publishes each new weight version to the policy replicas through Redis, and watches them follow.

The trainer does not know the replicas: it announces each version once (``common.fleet``: version,
checkpoint directory, digest), and every replica, however many there are and whenever it starts, loads the
newest announced version itself. What the trainer sees of the fleet is what the replicas report (their
version and state); it exports it as metrics and stops when the fleet cannot follow (see
``WeightPublisher.watch``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis

from ragr1.services.common import fleet
from ragr1.services.trainer import metrics

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """The replicas do not follow the trainer's versions (every one refused the newest, or none loaded it in
    time), or Redis announces versions this trainer never wrote: training on would only waste the update."""


def export(reports: list[fleet.ReplicaReport]) -> None:
    """The fleet as the trainer's gauges: replicas by version and state, and the oldest version generating."""
    metrics.FLEET_REPLICAS.clear()  # versions no replica serves any more leave, instead of staying at 0
    for (version, state), count in Counter((r.version, r.state) for r in reports).items():
        metrics.FLEET_REPLICAS.labels(str(version), state).set(count)
    generating = [r.version for r in reports if r.generating]
    metrics.FLEET_OLDEST_VERSION.set(min(generating) if generating else math.nan)


class WeightPublisher:
    """Announces versions and watches the fleet. ``timeout``: how long live replicas may go on without one
    of them serving the newest announced version before the trainer stops (``watch``)."""

    def __init__(self, client: redis.Redis, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.redis = client
        self.timeout = timeout
        self.clock = clock
        self.announced = 0  # the newest version in Redis, as this trainer last wrote or read it
        self._behind_since: float | None = None
        self._warned: set[tuple[str, int]] = set()

    def publish(self, version: int, checkpoint: Path, sha256: str) -> dict[str, object]:
        """Announces ``version`` (once: asked again, nothing is written); returns what was announced."""
        path = str(Path(checkpoint).resolve())
        if fleet.announce(self.redis, version, path, sha256):
            log.info("weights v%d announced: %s (sha256 %s)", version, path, sha256[:12])
        self.announced = max(self.announced, version)
        self._behind_since = None
        return {"version": version, "path": path, "sha256": sha256}

    def resume(self, version: int, checkpoint: Path | None, sha256: str = "") -> None:
        """At the trainer's start, at ``version`` (its latest checkpoint's, None without one): announces the
        checkpoint if Redis lacks it (the trainer died between saving and announcing, or Redis lost it).
        Raises ``PublishError`` when Redis announces a newer version, or this one with other weights: the
        announcements of another run on the same Redis, or checkpoints lost; replicas would serve weights
        this trainer never wrote."""
        current = fleet.latest(self.redis)
        if current is not None and (current.version > version or (
                current.version == version and checkpoint is not None and current.sha256 != sha256)):
            raise PublishError(
                f"Redis announces weights v{current.version} ({current.path}, sha256 {current.sha256[:12]}) but "
                f"this trainer resumes at v{version} from {checkpoint or 'its starting model'}"
                + (f" (sha256 {sha256[:12]})" if checkpoint is not None else "")
                + f": another run's announcements or lost checkpoints; to start a new run on this Redis, delete "
                f"its key {fleet.WEIGHTS} (and the run's streams)"
            )
        if checkpoint is not None:
            self.publish(version, checkpoint, sha256)
        elif current is not None:
            self.announced = current.version

    def watch(self) -> list[fleet.ReplicaReport]:
        """Reads the replicas' reports, exports them and checks that the fleet follows the newest announced
        version. Raises ``PublishError`` naming each replica's state when live replicas exist and either every
        one refused that version, or none has served it for ``timeout`` seconds. A fleet with no replica
        (scaled to zero, every replica restarting) stops nothing: a replica that starts loads the version
        itself. Returns the reports."""
        reports = fleet.replicas(self.redis)
        export(reports)
        for r in reports:
            if r.state == fleet.REFUSED and (r.name, r.target) not in self._warned:
                self._warned.add((r.name, r.target))
                log.warning("policy replica %s refused weights v%d: %s", r.name, r.target, r.reason)
        target = self.announced
        if not reports or target == 0 or any(r.version >= target for r in reports):
            self._behind_since = None
            return reports
        described = "; ".join(r.describe() for r in reports)
        if all(r.state == fleet.REFUSED and r.target >= target for r in reports):
            raise PublishError(f"every policy replica refused weights v{target}: {described}")
        now = self.clock()
        if self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since >= self.timeout:
            raise PublishError(
                f"no policy replica has served weights v{target} for {self.timeout:g} s after it was announced "
                f"while {len(reports)} reported (weights_timeout_seconds): {described}"
            )
        return reports
