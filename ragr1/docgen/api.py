"""``docs/reference/api.md``: the gRPC API, from the comments in ``proto/ragr1/v1/*.proto``.

protoc parses the files (``--include_source_info``) into a FileDescriptorSet, whose source locations hold
each element's comments, so the page and ``uncommented()`` see exactly what protoc sees.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2

from ragr1.docgen.markdown import HEADER, cell, code, slug, table
from ragr1.protogen import PROTO_DIR, proto_files

# Field numbers in descriptor.proto that make up a SourceCodeInfo.Location path.
_FILE_PACKAGE, _FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 2, 4, 5, 6
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM = 2, 3, 4
_ENUM_VALUE = 2
_SERVICE_METHOD = 2
_FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in _FDP.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The package's .proto files as protoc parses them, comments included."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--descriptor_set_out={out}",
                "--include_source_info", *[str(p.relative_to(PROTO_DIR)) for p in proto_files()]]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on proto/; run `make proto` to see why")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _comment(location: descriptor_pb2.SourceCodeInfo.Location | None) -> str:
    if location is None:
        return ""
    text = (location.leading_comments.strip() + "\n" + location.trailing_comments.strip()).strip()
    return " ".join(line.strip() for line in text.splitlines())


@dataclasses.dataclass
class Element:
    """A service, method, message, field, enum or enum value, with its comment."""

    kind: str
    name: str  # qualified inside the package, e.g. Rollout.spans
    file: str
    comment: str


class _File:
    def __init__(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        self.proto = proto
        self.locations = {tuple(loc.path): loc for loc in proto.source_code_info.location}

    def comment(self, *path: int) -> str:
        return _comment(self.locations.get(path))


def _messages(file: _File, messages: list[descriptor_pb2.DescriptorProto], path: tuple[int, ...], prefix: str
              ) -> Iterator[tuple[descriptor_pb2.DescriptorProto, str, tuple[int, ...]]]:
    for i, message in enumerate(messages):
        here = (*path, i)
        yield message, prefix + message.name, here
        yield from _messages(file, list(message.nested_type), (*here, _MESSAGE_NESTED), prefix + message.name + ".")


def _enums(file: _File) -> Iterator[tuple[descriptor_pb2.EnumDescriptorProto, str, tuple[int, ...]]]:
    for i, enum in enumerate(file.proto.enum_type):
        yield enum, enum.name, (_FILE_ENUM, i)
    for message, name, path in _messages(file, list(file.proto.message_type), (_FILE_MESSAGE,), ""):
        for i, enum in enumerate(message.enum_type):
            yield enum, f"{name}.{enum.name}", (*path, _MESSAGE_ENUM, i)


def elements() -> list[Element]:
    """Every service, method, message, field, enum and enum value of the package, with its comment."""
    out: list[Element] = []
    for proto in descriptor_set().file:
        if not proto.name.startswith("ragr1/"):
            continue
        f = _File(proto)
        for s, service in enumerate(proto.service):
            out.append(Element("service", service.name, proto.name, f.comment(_FILE_SERVICE, s)))
            for m, method in enumerate(service.method):
                out.append(Element("rpc", f"{service.name}.{method.name}", proto.name,
                                   f.comment(_FILE_SERVICE, s, _SERVICE_METHOD, m)))
        for message, name, path in _messages(f, list(proto.message_type), (_FILE_MESSAGE,), ""):
            out.append(Element("message", name, proto.name, f.comment(*path)))
            for i, field in enumerate(message.field):
                out.append(Element("field", f"{name}.{field.name}", proto.name,
                                   f.comment(*path, _MESSAGE_FIELD, i)))
        for enum, name, path in _enums(f):
            out.append(Element("enum", name, proto.name, f.comment(*path)))
            for i, value in enumerate(enum.value):
                out.append(Element("enum value", f"{name}.{value.name}", proto.name,
                                   f.comment(*path, _ENUM_VALUE, i)))
    return out


def uncommented() -> list[str]:
    """``kind name (file)`` of every element without a comment."""
    return [f"{e.kind} {e.name} ({e.file})" for e in elements() if not e.comment]


def _type_ref(type_name: str, package: str) -> str:
    """A link to a message or enum of the package, else the name."""
    short = type_name.removeprefix(f".{package}.")
    if short.startswith("."):
        return code(short.lstrip("."))
    return f"[{short}](#{slug(short)})"


def _field_type(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in (_FDP.TYPE_MESSAGE, _FDP.TYPE_ENUM):
        name = _type_ref(field.type_name, package)
    else:
        name = code(_SCALARS[field.type])
    return f"repeated {name}" if field.label == _FDP.LABEL_REPEATED else name


def render() -> str:
    files = [p for p in descriptor_set().file if p.name.startswith("ragr1/")]
    package = files[0].package
    parts = [HEADER.format(source="the comments in proto/ragr1/v1/*.proto"), f"""# gRPC API

Every process boundary is a message of the protobuf package `{package}` (`proto/ragr1/v1/`): the gRPC services
below and the payloads of the Redis streams (`PromptTask` on "prompts", `Rollout` on "rollouts"). Every server
also serves `grpc.health.v1.Health` and server reflection, so `grpcurl` can list and call it, honours the
call's deadline, and answers bad input with `INVALID_ARGUMENT` and a message that says what is wrong.
Python stubs are in `ragr1/v1/` (`make proto` regenerates them).
"""]
    headings: dict[str, str] = {}

    def heading(level: str, text: str) -> str:
        key = slug(text)
        if key in headings:
            raise RuntimeError(f"two headings {headings[key]!r} and {text!r} share the anchor #{key}")
        headings[key] = text
        return f"\n{level} {text}\n\n"

    services = [(f, s, i) for f in files for i, s in enumerate(f.service)]
    parts.append(heading("##", "Services"))
    for proto, service, s in services:
        f = _File(proto)
        parts.append(heading("###", service.name))
        parts.append(f"`{package}.{service.name}` in `proto/{proto.name}`. {cell(f.comment(_FILE_SERVICE, s))}\n\n")
        rows = []
        for m, method in enumerate(service.method):
            rows.append([code(method.name), _type_ref(method.input_type, package),
                         _type_ref(method.output_type, package), cell(f.comment(_FILE_SERVICE, s, _SERVICE_METHOD, m))])
        parts.append(table(["RPC", "Request", "Response", "Description"], rows))
    for proto in files:
        f = _File(proto)
        parts.append(heading("##", f"Messages of {Path(proto.name).name}"))
        about = f.comment(_FILE_PACKAGE)
        if about:
            parts.append(cell(about) + "\n")
        for message, name, path in _messages(f, list(proto.message_type), (_FILE_MESSAGE,), ""):
            parts.append(heading("###", name))
            parts.append(cell(f.comment(*path)) + "\n\n")
            if not message.field:
                parts.append("No fields.\n")
                continue
            rows = [[code(field.name), str(field.number), _field_type(field, package),
                     cell(f.comment(*path, _MESSAGE_FIELD, i))] for i, field in enumerate(message.field)]
            parts.append(table(["Field", "Number", "Type", "Description"], rows))
        for enum, name, path in _enums(f):
            parts.append(heading("###", name))
            parts.append(cell(f.comment(*path)) + "\n\n")
            rows = [[code(value.name), str(value.number), cell(f.comment(*path, _ENUM_VALUE, i))]
                    for i, value in enumerate(enum.value)]
            parts.append(table(["Value", "Number", "Description"], rows))
    return "".join(parts)
