"""Hostile input for any gRPC service, from its descriptors alone: hypothesis strategies of request bytes
(raw garbage, messages with extreme field values, and those messages cut or with bytes flipped), and the
check every RPC must pass: an answer within the deadline, with OK or a status code that names the
caller's mistake, never a crash, a hang or an internal error."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message_factory
from hypothesis import strategies as st

FD = pb_descriptor.FieldDescriptor

# What a request may get back: served, or refused with a reason for the caller. UNKNOWN and INTERNAL
# (an exception escaped), UNAVAILABLE (the server went away) and DEADLINE_EXCEEDED (it hung) may not.
DEFINED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "<search> a, b </search>", "</information>", "é" * 300, "a," * 50]),
)
_INTS = st.one_of(st.integers(-3, 70), st.sampled_from([-(2**31), 2**31 - 1, 4096, 10**6]))
_FLOATS = st.one_of(
    st.floats(-5, 5), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -0.0])
)


def _value(field: FD, depth: int) -> st.SearchStrategy[object]:
    t = field.type
    if t == FD.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if t == FD.TYPE_ENUM:
        return st.integers(-1, len(field.enum_type.values) + 1)
    if t == FD.TYPE_STRING:
        return _TEXT
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=40)
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return _FLOATS
    if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1) | st.integers(0, 70)
    if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1) | st.integers(0, 70)
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return _INTS
    return st.one_of(_INTS, st.sampled_from([-(2**63), 2**63 - 1]))


@st.composite
def _message(draw: st.DrawFn, descriptor: pb_descriptor.Descriptor, depth: int) -> bytes:
    cls = message_factory.GetMessageClass(descriptor)
    fields = {}
    for field in descriptor.fields:
        if field.type == FD.TYPE_MESSAGE and depth >= 2:
            continue
        if not draw(st.booleans()):
            continue
        values = _value(field, depth)
        if field.is_repeated:
            fields[field.name] = draw(st.lists(values, max_size=5))
        else:
            fields[field.name] = draw(values)
    message = cls()
    for name, value in fields.items():
        field = descriptor.fields_by_name[name]
        target = getattr(message, name)
        if field.type == FD.TYPE_MESSAGE:
            if field.is_repeated:
                for part in value:  # type: ignore[attr-defined]
                    target.add().MergeFromString(part)
            else:
                target.MergeFromString(value)
        elif field.is_repeated:
            target.extend(value)
        else:
            setattr(message, name, value)
    return message.SerializeToString()


def messages(descriptor: pb_descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[bytes]:
    """Serialized messages of ``descriptor`` with arbitrary (and extreme) field values."""
    return _message(descriptor, depth)


@st.composite
def _mutated(draw: st.DrawFn, descriptor: pb_descriptor.Descriptor) -> bytes:
    body = bytearray(draw(messages(descriptor)))
    if not body:
        return bytes(draw(st.binary(min_size=1, max_size=8)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body) - 1))
        if draw(st.booleans()):
            body[at] = draw(st.integers(0, 255))
        else:
            del body[at:]
            if not body:
                break
    return bytes(body)


def requests(descriptor: pb_descriptor.Descriptor) -> st.SearchStrategy[bytes]:
    """Request bodies for an RPC taking ``descriptor``: garbage, well-formed extremes, and corruptions."""
    return st.one_of(st.binary(max_size=64), messages(descriptor), _mutated(descriptor))


def methods(service: pb_descriptor.ServiceDescriptor) -> list[tuple[str, pb_descriptor.Descriptor]]:
    """(full method path, request descriptor) of every RPC of ``service``."""
    return [(f"/{service.full_name}/{m.name}", m.input_type) for m in service.methods]


def call(channel: grpc.Channel, path: str, body: bytes, timeout: float) -> grpc.StatusCode:
    """Sends raw ``body`` to ``path``; returns the status code it got."""
    rpc = channel.unary_unary(path)  # no serializers: bytes in, bytes out
    try:
        rpc(body, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK
