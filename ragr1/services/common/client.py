"""The one client base of this project: channels with TLS, the bearer token and deadlines attached once.

Every service's ``client.py`` subclasses ``Client`` (blocking) or ``AsyncClient`` (asyncio) for its
stub, and so does every internal caller (the policy's retriever and reward backends, the trainer's
weight publisher, the router's shard clients). The base opens the channel, attaches the bearer token
and a default deadline to every call made on it (a channel interceptor, so no call can forget them),
caps message sizes, answers ``health()`` for the service named by the stub's own descriptor, and is
a context manager. The two are twins: a service's sync and async clients have the same methods with
the same arguments (``timeout``, the call's deadline in seconds, last; ``None``: the client's default).
Every method raises ``ragr1.errors.ServiceCallError`` when a call fails; ``self.stub``, the generated
stub itself, stays there for raw gRPC.

This module and the clients load grpcio, protobuf and the generated stubs, nothing of the servers: the
clients install alone (``pip install ragr1`` with no extra).

In a deployment every client of a process is configured at once through the environment (the Helm
chart and the compose file set these from their secrets): ``RAGR1_CLIENT_CA_FILE`` (trust this CA:
TLS on), ``RAGR1_CLIENT_CERT_FILE`` and ``RAGR1_CLIENT_KEY_FILE`` (client certificate, for mTLS) and
``RAGR1_CLIENT_TOKEN_FILE`` (bearer token). Arguments given to ``ChannelOptions`` win over them.
"""

from __future__ import annotations

import collections
import dataclasses
import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragr1.errors import ServiceCallError
from ragr1.services.common.wire import DEFAULT_MAX_MESSAGE_BYTES, read_secret, service_name

__all__ = [
    "AsyncClient",
    "ChannelOptions",
    "Client",
    "HealthClient",
    "ServiceCallError",
    "open_aio_channel",
    "open_channel",
    "service_name",
]

CLIENT_ENV_PREFIX = "RAGR1_CLIENT_"
TOKEN_ENV = CLIENT_ENV_PREFIX + "TOKEN_FILE"
DEFAULT_HEALTH_TIMEOUT = 5.0
_SERVING = health_pb2.HealthCheckResponse.SERVING
_HEALTH_SERVICE = "grpc.health.v1.Health"


def _from_env(name: str) -> str:
    return os.environ.get(CLIENT_ENV_PREFIX + name, "")


def _token_from_env() -> str:
    path = os.environ.get(TOKEN_ENV, "")
    return read_secret(path, TOKEN_ENV) if path else ""


@dataclasses.dataclass(frozen=True)
class ChannelOptions:
    """How to reach a server: TLS material and the bearer token, all optional (defaults: environment)."""

    ca_file: str = dataclasses.field(default_factory=lambda: _from_env("CA_FILE"))
    cert_file: str = dataclasses.field(default_factory=lambda: _from_env("CERT_FILE"))  # for mTLS
    key_file: str = dataclasses.field(default_factory=lambda: _from_env("KEY_FILE"))
    token: str = dataclasses.field(default_factory=_token_from_env)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def grpc_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.ca_file:
            if self.cert_file or self.key_file:
                raise ValueError("a client certificate (mTLS) needs the server's CA too (ca_file)")
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca_file).read_bytes(),
            private_key=Path(self.key_file).read_bytes() if self.key_file else None,
            certificate_chain=Path(self.cert_file).read_bytes() if self.cert_file else None,
        )


# -- arguments checked before a request is built ----------------------------------------------------------
# protobuf would take a str as the sequence of its characters (16 one-letter queries) and raise a bare
# TypeError that names no argument: a client refuses both here, as INVALID_ARGUMENT naming the argument.
class ArgumentRefused(TypeError):
    """A client method's argument of the wrong type; ``_call`` raises it as ``ServiceCallError``."""


def _type_name(value: object) -> str:
    return type(value).__name__


def sequence_of(name: str, value: object, item_type: type | tuple[type, ...]) -> list[Any]:
    """``value`` as a list of ``item_type``: a list or tuple of them, never a bare str or bytes."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ArgumentRefused(f"{name} must be a list, got {_type_name(value)} {value!r:.60}")
    out = list(value)
    for i, item in enumerate(out):
        if not isinstance(item, item_type):
            raise ArgumentRefused(f"{name}[{i}] must be {_names(item_type)}, got {_type_name(item)} {item!r:.60}")
    return out


def integer(name: str, value: object) -> int:
    """An int (numpy's included: ``numbers.Integral``), never a bool or a str of digits."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ArgumentRefused(f"{name} must be an int, got {_type_name(value)} {value!r:.60}")
    return int(value)


def integers(name: str, value: object) -> list[int]:
    return [integer(f"{name}[{i}]", item) for i, item in enumerate(sequence_of(name, value, object))]


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ArgumentRefused(f"{name} must be a str, got {_type_name(value)} {value!r:.60}")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentRefused(f"{name} must be a bool, got {_type_name(value)} {value!r:.60}")
    return value


def _names(types_: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types_ if isinstance(types_, tuple) else (types_,)))


# -- what every call of a channel gets --------------------------------------------------------------
class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


@dataclasses.dataclass(frozen=True)
class _CallDefaults:
    """The bearer token added to a call's metadata, and a deadline where the call set none."""

    metadata: tuple[tuple[str, str], ...]
    timeout: float | None

    def fill(self, details: Any) -> tuple[float | None, tuple[tuple[str, str | bytes], ...]]:
        metadata = tuple(details.metadata or ())
        if not any(key == "authorization" for key, _ in metadata):  # a call's own token wins
            metadata += self.metadata
        return (self.timeout if details.timeout is None else details.timeout), metadata

    def sync(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        timeout, metadata = self.fill(details)
        return _CallDetails(
            details.method, timeout, metadata or None, details.credentials,
            getattr(details, "wait_for_ready", None), getattr(details, "compression", None),
        )

    def aio(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        timeout, metadata = self.fill(details)
        return details._replace(timeout=timeout, metadata=grpc.aio.Metadata(*metadata))


class _Interceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self.defaults = defaults

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        return continuation(self.defaults.sync(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                               request: Any) -> Any:
        return continuation(self.defaults.sync(details), request)


# grpc.aio sorts a channel's interceptors by kind and takes each object as one kind only.
class _AioUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self.defaults = defaults

    async def intercept_unary_unary(self, continuation: Callable[..., Any],
                                    details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        return await continuation(self.defaults.aio(details), request)


class _AioUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, defaults: _CallDefaults) -> None:
        self.defaults = defaults

    async def intercept_unary_stream(self, continuation: Callable[..., Any],
                                     details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        return await continuation(self.defaults.aio(details), request)


def open_channel(target: str, options: ChannelOptions | None = None, timeout: float | None = None) -> grpc.Channel:
    """A blocking channel whose every call carries the token and, unless it sets one, ``timeout``."""
    options = options or ChannelOptions()
    creds = options.credentials()
    if creds is None:
        channel = grpc.insecure_channel(target, options=options.grpc_options())
    else:
        channel = grpc.secure_channel(target, creds, options=options.grpc_options())
    return grpc.intercept_channel(channel, _Interceptor(_CallDefaults(options.metadata(), timeout)))


def open_aio_channel(target: str, options: ChannelOptions | None = None,
                     timeout: float | None = None) -> grpc.aio.Channel:
    """The asyncio twin of ``open_channel``; open it inside the event loop that will use it."""
    options = options or ChannelOptions()
    defaults = _CallDefaults(options.metadata(), timeout)
    interceptors: Sequence[grpc.aio.ClientInterceptor] = [_AioUnaryUnary(defaults), _AioUnaryStream(defaults)]
    creds = options.credentials()
    if creds is None:
        return grpc.aio.insecure_channel(target, options=options.grpc_options(), interceptors=interceptors)
    return grpc.aio.secure_channel(target, creds, options=options.grpc_options(), interceptors=interceptors)


# -- the client base -----------------------------------------------------------------------------------
StubT = TypeVar("StubT")


class _ClientBase(Generic[StubT]):
    # The generated stub class; subclasses set it, and may set their own default deadline.
    stub_type: type
    default_timeout: float = 10.0

    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float | None = None) -> None:
        self.target = target
        self.options = options or ChannelOptions()
        self.timeout = self.default_timeout if timeout is None else timeout
        self.service = service_name(self.stub_type)

    def _health_request(self, service: str | None) -> health_pb2.HealthCheckRequest:
        return health_pb2.HealthCheckRequest(service=self.service if service is None else service)

    def _request(self, method: str, request: Any) -> Any:
        """``request``, or ``request()`` where it is a function building one from a method's arguments: an
        argument it refuses is raised as ``ServiceCallError`` (INVALID_ARGUMENT, as the service would
        answer it) before anything is sent."""
        if not callable(request):
            return request
        try:
            return request()
        except ArgumentRefused as exc:
            raise ServiceCallError(
                grpc.StatusCode.INVALID_ARGUMENT, str(exc), service=self.service, method=method, target=self.target
            ) from exc

    def _failed(self, error: grpc.RpcError, method: str, service: str | None = None) -> ServiceCallError:
        return ServiceCallError.from_rpc_error(
            error, service=self.service if service is None else service, method=method, target=self.target
        )


class Client(_ClientBase[StubT]):
    """A blocking client of one service: ``self.stub`` calls it. Use it as a context manager."""

    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float | None = None) -> None:
        super().__init__(target, options, timeout)
        self.channel = open_channel(target, self.options, self.timeout)
        self.stub: StubT = self.stub_type(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        """``self.stub.<method>(request)`` with the call's deadline; a failure raised as ``ServiceCallError``.
        ``request`` may be a function that builds it from the method's arguments (see ``_request``)."""
        request = self._request(method, request)
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._failed(exc, method) from exc

    def health(self, timeout: float = DEFAULT_HEALTH_TIMEOUT, service: str | None = None) -> bool:
        """True when the server reports the service (``""``: the whole server) SERVING."""
        try:
            reply = self._health.Check(self._health_request(service), timeout=timeout)
        except grpc.RpcError as exc:
            raise self._failed(exc, "Check", _HEALTH_SERVICE) from exc
        return bool(reply.status == _SERVING)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



class AsyncClient(_ClientBase[StubT]):
    """The asyncio client of one service: ``self.stub`` calls it. Use it as an async context manager.

    The channel opens on first use, so that it belongs to the event loop that uses it (a client may be
    built before ``asyncio.run``)."""

    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float | None = None) -> None:
        super().__init__(target, options, timeout)
        self._channel: grpc.aio.Channel | None = None
        self._stub: StubT | None = None
        self._health: health_pb2_grpc.HealthStub | None = None

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = open_aio_channel(self.target, self.options, self.timeout)
            self._stub = self.stub_type(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._channel

    @property
    def stub(self) -> StubT:
        self._open()
        assert self._stub is not None
        return self._stub

    async def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        """The twin of ``Client._call``."""
        request = self._request(method, request)
        try:
            return await getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._failed(exc, method) from exc

    async def health(self, timeout: float = DEFAULT_HEALTH_TIMEOUT, service: str | None = None) -> bool:
        """True when the server reports the service (``""``: the whole server) SERVING."""
        self._open()
        assert self._health is not None
        try:
            reply = await self._health.Check(self._health_request(service), timeout=timeout)
        except grpc.RpcError as exc:
            raise self._failed(exc, "Check", _HEALTH_SERVICE) from exc
        return bool(reply.status == _SERVING)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub, self._health = self._channel, None, None, None
            await channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()



class HealthClient(Client[health_pb2_grpc.HealthStub]):
    """``grpc.health.v1`` alone, for probes: ``health(service="")`` asks about the whole server."""

    stub_type = health_pb2_grpc.HealthStub

    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float | None = None) -> None:
        super().__init__(target, options, timeout)
        self.service = ""
