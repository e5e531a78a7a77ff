"""The one way every service starts its gRPC server.

A server built here has: ``grpc.health.v1`` and server reflection; a Prometheus endpoint with calls
by method and status code and latency histograms; message size caps; optional TLS or mTLS; optional
bearer-token auth (health checks exempt, so that probes work without the secret); errors from the
core mapped to status codes; and a graceful shutdown on SIGTERM: health goes NOT_SERVING, the server
waits ``drain_seconds`` for load balancers to notice, in-flight calls get ``grace_seconds`` to finish,
then the process exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragr1.services.common import errors, ports
from ragr1.services.common.config import Listening, setting
from ragr1.services.common.metrics import RPC_IN_FLIGHT, RPC_LATENCY, RPC_REQUESTS, SERVING, serve_metrics
from ragr1.services.common.wire import DEFAULT_MAX_MESSAGE_BYTES, read_secret, service_name

log = logging.getLogger(__name__)

HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
# A health service that is SERVING from the server's start until it stops, whatever the server's own status
# (the empty service name, which readiness asks): what liveness and startup probes ask. A server that is up
# but not ready (a policy replica that refused a weight version) must get no traffic, but restarting it
# would only load the same version again.
LIVENESS = "liveness"

ERROR_CODES: dict[type[errors.ServiceError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]
    return grpc.StatusCode.INTERNAL


@dataclasses.dataclass
class ServerConfig(Listening):
    """Settings every gRPC server has. Services subclass this and add their own."""

    help_group: ClassVar[str] = "server"

    if TYPE_CHECKING:
        # Each service's own setting, its default from ports.py: declared here for the server that reads it.
        @property
        def port(self) -> int: ...
    metrics_port: int = setting(
        -1, f"Prometheus /metrics port; -1 means the gRPC port + {ports.METRICS_OFFSET}, 0 a free port"
    )
    max_message_bytes: int = setting(DEFAULT_MAX_MESSAGE_BYTES, "largest gRPC message sent or received")
    grace_seconds: float = setting(10.0, "on SIGTERM, how long in-flight calls may take to finish")
    drain_seconds: float = setting(0.0, "on SIGTERM, how long health reports NOT_SERVING before stopping")
    auth_token_file: str = setting("", "file holding the bearer token clients must send (auth on if set)")
    log_level: str = setting("INFO", "logging level")

    def validate(self) -> None:
        super().validate()
        if self.grace_seconds < 0 or self.drain_seconds < 0:
            raise ValueError(
                f"grace_seconds and drain_seconds must be >= 0, got {self.grace_seconds} and {self.drain_seconds}"
            )

    def resolved_metrics_port(self, grpc_port: int) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return grpc_port + ports.METRICS_OFFSET if grpc_port else 0

    def auth_token(self) -> str | None:
        return read_secret(self.auth_token_file, "auth_token_file") if self.auth_token_file else None


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that answers UNAUTHENTICATED."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny, **kwargs)


@dataclasses.dataclass(frozen=True)
class _Undecodable:
    """A request body that failed to parse (e.g. invalid UTF-8 in a string field)."""

    error: DecodeError


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Keeps a parse failure for the handler to answer INVALID_ARGUMENT (and count); raised inside
    the deserializer it would reach the caller as UNKNOWN "Unexpected DecodeError", uncounted."""
    if deserialize is None:
        return None
    inner = deserialize

    def parse(data: bytes) -> Any:
        try:
            return inner(data)
        except DecodeError as exc:
            return _Undecodable(exc)

    return parse


class _Interceptor(grpc.aio.ServerInterceptor):
    """Auth, metrics and error mapping for every call of one server."""

    def __init__(self, service: str, token: str | None) -> None:
        self._service = service
        self._expected = f"Bearer {token}".encode() if token else None

    def _authorised(self, details: grpc.HandlerCallDetails) -> bool:
        if self._expected is None or details.method.startswith(HEALTH_METHOD_PREFIX):
            return True
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(got, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        if not self._authorised(details):
            return _deny_handler(handler, "missing or wrong bearer token in the 'authorization' metadata")
        if handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._observed(handler.unary_unary, details.method.rsplit("/", 1)[-1]),
            request_deserializer=_lenient(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def _observed(self, inner: Callable[..., Any], method: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        service = self._service

        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            recorded = False

            def record(code: grpc.StatusCode) -> None:
                # Before the status goes out on an error: a caller that reads /metrics once its call has
                # failed must find it counted.
                nonlocal recorded
                if not recorded:
                    recorded = True
                    RPC_IN_FLIGHT.labels(service).dec()
                    RPC_LATENCY.labels(service, method).observe(time.perf_counter() - start)
                    RPC_REQUESTS.labels(service, method, code.name).inc()

            RPC_IN_FLIGHT.labels(service).inc()
            try:
                if isinstance(request, _Undecodable):
                    raise errors.InvalidArgument(f"request is not a valid message: {request.error}")
                result = inner(request, context)
                if inspect.isawaitable(result):
                    result = await result
                record(grpc.StatusCode.OK)
                return result
            except errors.ServiceError as exc:
                code = status_for(exc)
                record(code)
                await context.abort(code, str(exc))
            except asyncio.CancelledError:
                remaining = context.time_remaining()
                record(
                    grpc.StatusCode.DEADLINE_EXCEEDED
                    if remaining is not None and remaining <= 0
                    else grpc.StatusCode.CANCELLED
                )
                raise
            except grpc.aio.AbortError:
                record(context.code() or grpc.StatusCode.UNKNOWN)
                raise
            except Exception as exc:
                log.exception("%s.%s failed", service, method)
                record(grpc.StatusCode.INTERNAL)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            finally:
                record(grpc.StatusCode.UNKNOWN)

        return behaviour


class ExitWith(Exception):
    """Raised by a job beside the server to stop it with exit code ``code``: an end its supervisor must tell
    apart from a failure (1) and from a job that finished (0), such as training that stopped for want of
    signal after updates it checkpointed."""

    def __init__(self, code: int, reason: str) -> None:
        if code in (0, 1):
            raise ValueError(f"exit code {code} is a finish (0) or a failure (1): pick another")
        super().__init__(reason)
        self.code = code


@dataclasses.dataclass(frozen=True)
class _Job:
    """See ``GrpcServer.beside``."""

    run: Callable[[], Awaitable[Any]]
    name: str
    stop: Callable[[], None] | None
    stop_seconds: float | None


# The signature of the ``add_XServicer_to_server`` functions protoc generates.
AddServicer = Callable[[Any, Any], None]


class GrpcServer:
    """A gRPC server with everything of the module docstring. Use ``start``/``stop`` or ``serve``.

    Every service builds one in ``build_server(config)`` (its servicers, the jobs that run beside it, the
    clean-ups at stop) and runs it in ``serve(config)``, which returns the exit code."""

    def __init__(self, config: ServerConfig, name: str, *, ready_at_start: bool = True) -> None:
        """``ready_at_start``: health SERVING as soon as it listens; False leaves it NOT_SERVING until a job of
        the server's says it is ready (``set_serving``)."""
        self.config = config
        self.name = name
        self.ready_at_start = ready_at_start
        self.health = health.aio.HealthServicer()
        self._servicers: list[tuple[AddServicer, Any, str]] = []
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.metrics_port = 0
        self._stopping = False
        self._jobs: list[_Job] = []
        self._cleanups: list[Callable[[], Awaitable[None]]] = []

    @property
    def _services(self) -> list[str]:
        return [name for _, _, name in self._servicers]

    def add(self, add_servicer: AddServicer, servicer: Any) -> None:
        """Registers a servicer (a subclass of a protoc-generated one, e.g. ``RewardServicer``); health and
        reflection name it by its proto's full name (``ragr1.v1.Reward``)."""
        self._servicers.append((add_servicer, servicer, service_name(type(servicer))))

    def beside(
        self,
        job: Callable[[], Awaitable[Any]],
        name: str,
        *,
        stop: Callable[[], None] | None = None,
        stop_seconds: float | None = None,
    ) -> None:
        """Work that runs while the server serves (a rollout worker, the training loop, a watchdog),
        started by ``serve``. When it ends the server stops: the service has nothing left to do (training
        finished) or cannot go on (the engine died: it raises, and the exit code is 1; ``ExitWith`` sets its
        own). At shutdown,
        ``stop`` asks it to finish and it gets ``stop_seconds`` (None: as long as it takes) before it is
        cancelled; a job without ``stop`` is cancelled after the ``on_stop`` clean-ups."""
        self._jobs.append(_Job(job, name, stop, stop_seconds))

    def on_stop(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Runs after the server stopped taking calls and the jobs with a stop hook have finished (or run
        out of time), before the others are cancelled; in the order added (close clients, then the engine)."""
        self._cleanups.append(cleanup)

    def _credentials(self) -> grpc.ServerCredentials | None:
        cfg = self.config  # validate() checked that the files come in pairs
        if not cfg.tls_cert_file:
            return None
        key = Path(cfg.tls_key_file).read_bytes()
        cert = Path(cfg.tls_cert_file).read_bytes()
        client_ca = Path(cfg.tls_client_ca_file).read_bytes() if cfg.tls_client_ca_file else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    async def start(self) -> None:
        """Binds and starts serving. Must run inside the event loop that will serve the calls."""
        cfg = self.config
        self._server = server = grpc.aio.server(
            interceptors=[_Interceptor(self.name, cfg.auth_token())],
            options=[
                ("grpc.max_send_message_length", cfg.max_message_bytes),
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ],
        )
        for add_servicer, servicer, _ in self._servicers:
            add_servicer(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection([*self._services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        address = f"{cfg.host}:{cfg.port}"
        # Checked first: gRPC says so only in a log line of its own and an error that names no port.
        if cfg.port and ports.port_in_use(cfg.host, cfg.port):
            raise OSError(f"{self.name}: gRPC port {address} is already in use")
        creds = self._credentials()
        try:
            if creds is None:
                if cfg.auth_token_file:
                    log.warning("%s: bearer-token auth over plaintext; turn TLS on outside loopback", self.name)
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, creds)
        except RuntimeError as exc:  # grpc raises where it once returned 0
            raise OSError(f"{self.name}: could not bind gRPC to {address}: {exc}") from exc
        if self.port == 0:
            raise OSError(f"{self.name}: could not bind gRPC to {address}")
        await server.start()
        try:
            self.metrics_port = serve_metrics(cfg.host, cfg.resolved_metrics_port(self.port))
        except OSError:
            await server.stop(None)  # in this loop: left to the collector, it is stopped after the loop closed
            raise
        await self.set_serving(self.ready_at_start)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s: gRPC on %s:%d, metrics on http://%s:%d/metrics",
                 self.name, cfg.host, self.port, cfg.host, self.metrics_port)

    async def set_serving(self, serving: bool) -> None:
        if serving and self._stopping:  # a job that recovers while the server drains must not undo the drain
            return
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ["", *self._services]:
            await self.health.set(service, status)
        SERVING.labels(self.name).set(1 if serving else 0)

    async def stop(self) -> None:
        """Graceful: NOT_SERVING, drain, let in-flight calls finish within the grace period, stop."""
        if self._stopping:
            return
        self._stopping = True
        await self.health.enter_graceful_shutdown()
        SERVING.labels(self.name).set(0)
        if self.config.drain_seconds > 0:
            await asyncio.sleep(self.config.drain_seconds)
        if self._server is not None:
            await self._server.stop(self.config.grace_seconds)
        log.info("%s: stopped", self.name)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def serve(self) -> int:
        """Starts, runs the jobs added with ``beside`` and serves until SIGTERM or SIGINT or until a job
        ends; then stops gracefully, runs the ``on_stop`` clean-ups in order and cancels the jobs still
        running. Returns the process's exit code: 1 if a job raised (logged), else an ``ExitWith``'s code, else
        0."""
        await self.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"READY {self.name} grpc={self.config.host}:{self.port} metrics={self.metrics_port}", flush=True)
        jobs = {asyncio.ensure_future(job.run()): job for job in self._jobs}
        waiter = asyncio.ensure_future(self.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiter, stopper, *jobs], return_when=asyncio.FIRST_COMPLETED)
        # Every job is asked to stop first, together (a rollout worker must take no new work while the server
        # drains), and each gets its stop_seconds from this moment: together they fit the deployment's grace.
        asked = loop.time()
        for task, job in jobs.items():
            if job.stop is not None and not task.done():
                job.stop()
        await self.stop()
        for task, job in jobs.items():
            if job.stop is not None and not task.done():
                left = None if job.stop_seconds is None else max(0.0, asked + job.stop_seconds - loop.time())
                await asyncio.wait([task], timeout=left)
        for cleanup in self._cleanups:
            await cleanup()
        tasks = [waiter, stopper, *jobs]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # a job's error is read (and logged) below, not raised here
        return self._exit_code(jobs)

    def _exit_code(self, jobs: dict[asyncio.Task[Any], _Job]) -> int:
        failed, chosen = False, 0
        for task, job in jobs.items():
            exc = None if task.cancelled() else task.exception()
            if isinstance(exc, ExitWith):
                log.warning("%s: %s stopped the server (exit code %d): %s", self.name, job.name, exc.code, exc)
                chosen = exc.code
            elif exc is not None:
                log.error("%s: %s stopped the server: %s: %s", self.name, job.name, type(exc).__name__, exc,
                          exc_info=exc)
                failed = True
        # A failure outranks a chosen end: the supervisor must not read a crash as the outcome a job chose.
        return 1 if failed else chosen
