"""The one exception a client of a RAG-R1 service raises: ``ServiceCallError``.

Every method of the shipped clients (``ragr1.services.<name>.client``, sync and async alike) turns a
failed call into this type, so that a caller writes one ``except`` for any service and still learns
which call failed, with which status, and what the service said::

    from ragr1.errors import ServiceCallError

    try:
        reply = client.search(["who wrote hamlet"])
    except ServiceCallError as err:
        if err.code is grpc.StatusCode.INVALID_ARGUMENT:
            ...  # err.message says what was wrong with the request
        print(err)  # ragr1.v1.Retriever/Search at 127.0.0.1:50051: INVALID_ARGUMENT: top_k must be ...

It imports only ``grpc``: catching it must not cost a user the heavy parts of the project.
(The services' own cores raise ``ragr1.services.common.errors``; the server maps those to status codes,
and this type is what they look like from the calling side.)
"""

from __future__ import annotations

import grpc

__all__ = ["ServiceCallError"]


class ServiceCallError(Exception):
    """A call to a service that failed: its gRPC status ``code`` and the service's ``message``, with
    ``service`` (the proto's full name, ``ragr1.v1.Retriever``), ``method`` and ``target`` (the address)
    naming the call, and ``debug``, gRPC's own account of the failure (empty when there is none).

    ``str(err)`` is one line with all but ``debug``; the original ``grpc.RpcError``, where there was
    one, is ``err.__cause__``."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        service: str,
        method: str,
        target: str,
        debug: str = "",
    ) -> None:
        self.code = code
        self.message = message
        self.service = service
        self.method = method
        self.target = target
        self.debug = debug
        super().__init__(code, message, service, method, target)

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, *, service: str, method: str, target: str) -> ServiceCallError:
        """The status, message and debug string of a failed gRPC call (``grpc.Call`` and ``grpc.aio``
        errors alike), with the call's name."""
        code_of = getattr(error, "code", None)
        code = code_of() if callable(code_of) else None
        details_of = getattr(error, "details", None)
        message = details_of() if callable(details_of) else None
        debug_of = getattr(error, "debug_error_string", None)
        debug = debug_of() if callable(debug_of) else None
        return cls(
            code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN,
            message or str(error),
            service=service,
            method=method,
            target=target,
            debug=debug or "",
        )

    @property
    def call(self) -> str:
        """``ragr1.v1.Retriever/Search``: the full method name, as gRPC writes it."""
        return f"{self.service}/{self.method}" if self.method else self.service

    def __str__(self) -> str:
        # One line whatever the service wrote, so that a log or a CLI error stays one line.
        return f"{self.call} at {self.target}: {self.code.name}: {' '.join(self.message.split())}"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields: the default pickling (``cls(*args)``) would drop them; exceptions cross
        # process boundaries (multiprocessing, Ray) by pickle.
        return (_rebuild, (self.code, self.message, self.service, self.method, self.target, self.debug))


def _rebuild(
    code: grpc.StatusCode, message: str, service: str, method: str, target: str, debug: str
) -> ServiceCallError:
    return ServiceCallError(code, message, service=service, method=method, target=target, debug=debug)
