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
from ragr1.services.common.streams import Backlog
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


def export_backlog(backlog: Backlog) -> None:
    """The rollout workers' prompts as the gauges the fleet's autoscaler reads."""
    metrics.PROMPTS_BACKLOG.labels("waiting").set(backlog.waiting)
    metrics.PROMPTS_BACKLOG.labels("in_progress").set(backlog.in_progress)
    metrics.PROMPT_HOLDERS.set(backlog.holders)


class StrandedAlarm:
    """The prompts-stranded alarm: prompts waiting or in progress while no policy replica takes prompts (none
    reports serving) for ``threshold`` seconds (0: off). A fleet scaled up from zero has no replica taking prompts
    until one has started and loaded the weights, so the threshold is longer than that; replicas that all refused
    the weights or never get past their start take none either. A loading replica takes none: counting it as
    taking would let a fleet that refuses a version stay silent for good, each replica loading again at every
    retry of the refused version. Exports how long it has lasted and the threshold (the alert rule compares
    them), and logs a warning when it crosses the threshold."""

    name = "prompts_stranded"

    def __init__(self, threshold: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.clock = clock
        self._since: float | None = None
        self._warned = False
        if threshold > 0:
            metrics.ALARM_THRESHOLD.labels(self.name).set(threshold)

    def observe(self, backlog: Backlog, reports: list[fleet.ReplicaReport]) -> float:
        """How long the prompts have been stranded, as of now (0 when they are not)."""
        left = backlog.waiting + backlog.in_progress
        if not left or any(r.takes_prompts for r in reports):
            self._since, self._warned = None, False
            metrics.PROMPTS_STRANDED.set(0)
            return 0.0
        now = self.clock()
        if self._since is None:
            self._since = now
        seconds = now - self._since
        metrics.PROMPTS_STRANDED.set(seconds)
        if self.threshold > 0 and seconds >= self.threshold and not self._warned:
            self._warned = True
            fleet_said = "; ".join(r.describe() for r in reports) or "no replica reports"
            log.warning("%d prompts have waited or been in progress for %.0f s while no policy replica takes "
                        "prompts (%s): training waits for rollouts nobody makes", left, seconds, fleet_said)
        return seconds


def _follows(replica: fleet.ReplicaReport, version: int) -> bool:
    """Whether the replica serves ``version`` or a newer one. The starting weights are version 0 as a replica's
    own model is, so at equal versions a replica still loading or refusing that version does not."""
    if replica.version != version:
        return replica.version > version
    return not (replica.state in (fleet.LOADING, fleet.REFUSED) and replica.target == version)


class WeightPublisher:
    """Announces versions and watches the fleet. ``timeout``: how long live replicas may go on without one
    of them serving the newest announced version before the trainer stops (``watch``)."""

    def __init__(self, client: redis.Redis, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.redis = client
        self.timeout = timeout
        self.clock = clock
        self.announced: int | None = None  # the newest version in Redis, as this trainer last wrote it
        self._behind_since: float | None = None
        self._warned: set[tuple[str, int]] = set()

    def publish(self, version: int, checkpoint: Path, sha256: str) -> dict[str, object]:
        """Announces ``version`` (once: asked again, nothing is written); returns what was announced."""
        path = str(Path(checkpoint).resolve())
        if fleet.announce_checkpoint(self.redis, version, Path(path), sha256):
            log.info("weights v%d announced: %s (sha256 %s)", version, path, sha256[:12])
        self.announced = max(self.announced or 0, version)
        self._behind_since = None
        return {"version": version, "path": path, "sha256": sha256}

    def resume(self, version: int, checkpoint: Path, sha256: str) -> None:
        """At the trainer's start, at ``version`` with the weights in ``checkpoint`` (its latest checkpoint's, or
        the model it starts from): announces them unless Redis has them already, so that every replica, whenever
        it starts, serves the weights the trainer trains from (the starting weights included: a replica's own
        model may be another). Raises ``PublishError`` when Redis announces a newer version, or this one with
        other weights: the announcements of another run on the same Redis, or checkpoints lost; replicas would
        serve weights this trainer never wrote."""
        current = fleet.latest(self.redis)
        if current is not None and (current.version > version or (
                current.version == version and current.sha256 != sha256)):
            raise PublishError(
                f"Redis announces weights v{current.version} ({current.path}, sha256 {current.sha256[:12]}) but "
                f"this trainer resumes at v{version} from {checkpoint} (sha256 {sha256[:12]}): another run's "
                f"announcements or lost checkpoints; to start a new run on this Redis, delete its key "
                f"{fleet.WEIGHTS} (and the run's streams)"
            )
        self.publish(version, checkpoint, sha256)

    def in_use(self) -> set[int]:
        """The versions replicas report serving, loading or retrying: checkpoints pruning must keep."""
        return {v for r in fleet.replicas(self.redis) for v in (r.version, r.target) if v}

    def watch(self) -> list[fleet.ReplicaReport]:
        """Reads the replicas' reports, exports them and checks that the fleet follows the newest announced
        version. Raises ``PublishError`` naming each replica's state when live replicas exist and none has
        served that version for ``timeout`` seconds: a replica that refused it tries again (a checkpoint that
        shared storage shows late), so a refusal alone stops nothing, nor does a refusing replica while
        another serves. A fleet with no replica (scaled to zero, every replica restarting) stops nothing
        either: a replica that starts loads the version itself. Returns the reports."""
        reports = fleet.replicas(self.redis)
        export(reports)
        for r in reports:
            if r.state == fleet.REFUSED and (r.name, r.target) not in self._warned:
                self._warned.add((r.name, r.target))
                log.warning("policy replica %s refused weights v%d: %s", r.name, r.target, r.reason)
        target = self.announced
        if not reports or target is None or any(_follows(r, target) for r in reports):
            self._behind_since = None
            return reports
        described = "; ".join(r.describe() for r in reports)
        now = self.clock()
        if self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since >= self.timeout:
            raise PublishError(
                f"no policy replica has served weights v{target} for {self.timeout:g} s after it was announced "
                f"while {len(reports)} reported (weights_timeout_seconds): {described}"
            )
        return reports
