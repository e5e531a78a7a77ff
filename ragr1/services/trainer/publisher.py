"""Sends each new weight version to every configured policy replica (``Policy.UpdateWeights``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from ragr1.errors import ServiceCallError
from ragr1.services.common.client import TOKEN_ENV, ChannelOptions
from ragr1.services.policy.client import PolicyClient
from ragr1.services.trainer import metrics
from ragr1.v1 import policy_pb2

log = logging.getLogger(__name__)

# Codes no retry can cure: the trainer's configuration (token, certificate) does not match the policy's.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
# A replica down, too slow, refusing the token, or refusing the checkpoint.
_WATCHED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.FAILED_PRECONDITION)


class PublishError(RuntimeError):
    """A replica kept refusing weight versions: training on would only produce stale rollouts."""


def _hint(code: grpc.StatusCode | None) -> str:
    if code in _REFUSED:
        return f" (set {TOKEN_ENV} in the trainer to a file holding the token of the policy's --auth-token-file)"
    return ""


class WeightPublisher:
    """One client per replica, opened once. A replica that fails is logged and counted and the others
    still get the version; training goes on (the version travels in the rollouts, so a replica that
    lags produces rollouts the trainer sees as stale) until one replica has refused ``max_failures``
    pushes in a row: then ``publish`` raises ``PublishError``, so that a trainer whose versions never
    arrive stops with the reason instead of training on while the policy serves old weights.

    A replica that is down (UNAVAILABLE: restarting, its pod rescheduled) is not counted: it makes no
    rollouts meanwhile, the others go on, and ``sync`` sends it the current version once it is back.
    Counting it would stop the trainer whenever a replica's restart outlasts ``max_failures`` updates,
    though no replica refused anything."""

    def __init__(
        self,
        replicas: Sequence[str],
        timeout: float,
        options: ChannelOptions | None = None,
        max_failures: int = 3,
    ) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, got {max_failures}")
        self.timeout = timeout
        self.max_failures = max_failures
        self._clients = {target: PolicyClient(target, options, timeout=timeout) for target in replicas}
        self._failures = dict.fromkeys(self._clients, 0)
        # The failures an operator acts on exist as series from the start (at 0), so that a dashboard
        # shows "none" rather than "no data".
        for code in _WATCHED:
            metrics.WEIGHT_UPDATE_FAILURES.labels(code.name)

    def check(self, timeout: float = 10.0) -> None:
        """Asks every replica for its version, so that a refused token stops the trainer at start,
        before any training. A replica that does not answer yet is only logged."""
        for target, client in self._clients.items():
            try:
                client.weight_version(timeout=timeout)
            except ServiceCallError as exc:
                if exc.code in _REFUSED:
                    raise PublishError(
                        f"policy replica {target} refuses the trainer: {exc.code.name}: {exc.message}"
                        + _hint(exc.code)
                    ) from exc
                log.warning("policy replica %s not reachable yet: %s", target, exc.message)

    def publish(self, version: int, checkpoint: Path) -> dict[str, str]:
        """Returns replica -> "ok" or the error; raises ``PublishError`` at the bound (see the class),
        after every replica was tried."""
        results = {}
        path = str(Path(checkpoint).resolve())
        exhausted: list[str] = []
        for target in self._clients:
            failure = self._push(target, version, path)
            if failure is None:
                results[target] = "ok"
                self._failures[target] = 0
                continue
            code, error = failure
            results[target] = error
            if code == grpc.StatusCode.UNAVAILABLE:
                log.warning("UpdateWeights v%d: replica %s is down (%s); it gets the version when it is back",
                            version, target, error)
                continue
            self._failures[target] += 1
            log.warning("UpdateWeights v%d on %s failed (%d in a row): %s",
                        version, target, self._failures[target], error)
            if self._failures[target] >= self.max_failures:
                exhausted.append(
                    f"policy replica {target} failed {self._failures[target]} weight updates in a row, "
                    f"the last (v{version}) with {error}"
                )
        if exhausted:
            raise PublishError("; ".join(exhausted))
        return results

    def sync(self, version: int, checkpoint: Path) -> dict[str, str]:
        """Pushes ``version`` again to every replica that serves an older one: a replica that restarted
        came back with its starting weights (version 0), and every rollout it made would be too stale to
        train on while the trainer, getting no batch, would never push again. Replicas that do not answer
        (still starting) are left for the next call; nothing here counts towards ``max_failures``.
        Returns replica -> "ok" or the error, for the replicas it pushed to."""
        results = {}
        for target, client in self._clients.items():
            try:
                served = client.weight_version(timeout=min(self.timeout, 5.0)).version
            except ServiceCallError:
                continue
            if served >= version:
                continue
            log.warning("policy replica %s serves v%d, the trainer is at v%d: pushing v%d again",
                        target, served, version, version)
            failure = self._push(target, version, str(Path(checkpoint).resolve()))
            results[target] = failure[1] if failure else "ok"
        return results

    def _push(self, target: str, version: int, path: str) -> tuple[grpc.StatusCode, str] | None:
        """One UpdateWeights call; None, or the failure's code and text (code: details, with a hint)."""
        start = time.perf_counter()
        try:
            self._clients[target].update_weights(version, path, policy_pb2.IN_FLIGHT_POLICY_FINISH)
            return None
        except ServiceCallError as exc:
            metrics.WEIGHT_UPDATE_FAILURES.labels(exc.code.name).inc()
            return exc.code, f"{exc.code.name}: {exc.message}{_hint(exc.code)}"
        finally:
            metrics.WEIGHT_UPDATE_SECONDS.observe(time.perf_counter() - start)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
