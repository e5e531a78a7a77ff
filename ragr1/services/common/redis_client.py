"""Connecting to the queue's Redis: a client that waits out a Redis restarting but not a refused password,
with AUTH from a file and TLS files checked before the first command (``streams.QueueConfig`` builds one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry

from ragr1.services.common.wire import read_secret

# How long a client of the queue waits out a Redis that is down (a restart from its append-only file takes
# seconds; the supervisor's first backoff is 1 s, a pod's restart more): waits doubling from under half a
# second up to the cap, half a minute to three quarters of one in all, after which the caller sees the
# ConnectionError.
RECONNECT_RETRIES = 12
RECONNECT_CAP_SECONDS = 5.0


def _scheme(url: str) -> str:
    # Only the scheme goes into a message: the rest of the URL may hold a password.
    return url.split("://", 1)[0] + "://" if "://" in url else "no scheme"


@dataclasses.dataclass(frozen=True)
class RedisTLS:
    """A Redis client's TLS files (PEM); all optional: a ``rediss://`` URL alone trusts the system's CAs."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def _files(self) -> list[tuple[str, str, str]]:
        """(setting, redis-py argument, path) of each file given."""
        files = [("redis_ca_file", "ssl_ca_certs", self.ca_file), ("redis_cert_file", "ssl_certfile", self.cert_file),
                 ("redis_key_file", "ssl_keyfile", self.key_file)]
        return [file for file in files if file[2]]

    def check(self, url: str) -> None:
        """Raises ValueError naming the setting: files without a TLS URL (they would be ignored and the
        queue's traffic sent in the clear), half a client certificate."""
        given = [name for name, _, _ in self._files()]
        if given and not url.startswith("rediss://"):
            raise ValueError(f"{', '.join(given)}: TLS files need a rediss:// redis_url, got {_scheme(url)}")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a Redis client certificate needs both redis_cert_file and redis_key_file")

    def client_kwargs(self, url: str) -> dict[str, str]:
        """redis-py's TLS arguments; a missing file is named here, not after 30 s of reconnecting."""
        self.check(url)
        for name, _, path in self._files():
            if not Path(path).is_file():
                raise ValueError(f"{name} {path}: no such file")
        return {argument: path for _, argument, path in self._files()}


class _Refused(Exception):
    """Carries a refused password through redis-py's retry loop, which takes it for a connection error."""


class _QueueRetry(Retry):
    """Waits out a Redis that is down, but not one that refuses the password: redis-py's
    AuthenticationError is a ConnectionError, so a wrong password would be retried for the whole reconnect
    window before anyone saw it."""

    def call_with_retry(self, do: Callable[[], Any], fail: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def attempt() -> Any:
            try:
                return do()
            except redis.AuthenticationError as exc:
                raise _Refused() from exc

        try:
            return super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.__cause__ from None  # type: ignore[misc]


def connect(url: str, password_file: str = "", tls: RedisTLS | None = None) -> redis.Redis:
    """A client for the queue's Redis that reconnects with backoff instead of failing at the first refused
    connection (redis-py's default here: no retry, so a Redis restart killed the trainer). A command whose
    reply was lost is sent again: every write of the queue is safe to repeat (ids de-duplicate), except
    the admission counters, which a lost reply at the wrong moment can leave a few rollouts off.

    ``password_file``: Redis AUTH with the password held there, which stays out of the URL, so out of
    command lines, environments and logs; a password in the URL (``redis://:pw@host``) works too.
    ``tls``: the CA and client certificate for a ``rediss://`` URL (TLS; the server's name is checked)."""
    return redis.Redis.from_url(
        url,
        password=read_secret(password_file, "redis_password_file") if password_file else None,
        retry=_QueueRetry(EqualJitterBackoff(base=0.25, cap=RECONNECT_CAP_SECONDS), RECONNECT_RETRIES),
        socket_connect_timeout=5.0,
        # No health_check_interval: its check retries inside the connect's retry, so a connection that
        # fails after its handshake (a TLS client certificate refused) would take 12 x 12 tries to fail.
        # A dead connection is found by keepalive or by the command itself, which is retried.
        socket_keepalive=True,
        **(tls or RedisTLS()).client_kwargs(url),
    )
