"""What a server and its clients agree on, apart from both: the message size cap, a service's name (from
its proto) and secrets read from files.

Clients import this, never ``server.py``: a client installed alone (``pip install ragr1``, no extra) has
grpcio and protobuf, not the server's reflection, metrics, configuration files or the services' cores.
"""

from __future__ import annotations

import importlib
from pathlib import Path

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def service_name(generated: type) -> str:
    """``ragr1.v1.Retriever`` for ``RetrieverStub`` or ``RetrieverServicer`` (or a subclass of one), from
    the descriptor of the ``_pb2`` module protoc generated beside their ``_pb2_grpc`` module: the proto is
    the one home of a service's name."""
    base = next((c for c in generated.__mro__ if c.__module__.endswith("_pb2_grpc")), None)
    if base is None:
        raise TypeError(f"{generated.__name__} is not a protoc-generated stub or servicer, nor derived from one")
    messages = importlib.import_module(base.__module__.removesuffix("_grpc"))
    service = base.__name__.removesuffix("Stub").removesuffix("Servicer")
    return str(messages.DESCRIPTOR.services_by_name[service].full_name)


def read_secret(path: str, what: str) -> str:
    """The secret held in the file ``path`` (a token, a password), stripped; an error names ``what`` and
    the file, never the content."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from exc
    if not secret:
        raise ValueError(f"{what} {path} is empty")
    return secret
