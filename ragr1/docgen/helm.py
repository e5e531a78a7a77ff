"""``docs/reference/helm-values.md``: every value of the Helm chart, from ``values.schema.json`` (type and
description: the schema is what Helm checks values against) and ``values.yaml`` (the default)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import yaml

from ragr1.docgen.markdown import HEADER, ROOT, cell, code, slug, table

CHART = ROOT / "deploy" / "helm" / "ragr1"
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Value:
    path: str  # dotted, e.g. retriever.router.replicas
    type: str
    description: str
    default: Any  # _MISSING when values.yaml does not set it


def schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (``#/definitions/x``) merged under its own keys."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, root), **{k: v for k, v in node.items() if k != "$ref"}}


def type_of(node: dict[str, Any], ref: str = "") -> str:
    if ref.endswith("/quantity"):
        return "quantity"
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(kinds)
    if "array" in kinds and isinstance(node.get("items"), dict):
        items = node["items"]
        text = f"list of {type_of(items)}" if "type" in items or "enum" in items else text
    bounds = []
    if "minimum" in node:
        bounds.append(f">= {node['minimum']}")
    if "exclusiveMinimum" in node:
        bounds.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        bounds.append(f"<= {node['maximum']}")
    if "pattern" in node:
        bounds.append(f"matching {node['pattern']}")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def values(node: dict[str, Any] | None = None, path: tuple[str, ...] = ()) -> Iterator[Value]:
    """Every value the schema declares, parents before their children, in the schema's order."""
    root = schema()
    found = defaults()
    node = root if node is None else node

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> Iterator[Value]:
        for key, child in node.get("properties", {}).items():
            here = (*path, key)
            resolved = _resolve(child, root)
            default: Any = found
            for part in here:
                default = default.get(part, _MISSING) if isinstance(default, dict) else _MISSING
            if "properties" in child:  # its values have rows of their own, with their defaults
                default = _MISSING
            yield Value(".".join(here), type_of(resolved, child.get("$ref", "")), resolved.get("description", ""),
                        default)
            if "$ref" not in child:
                yield from walk(child, here)

    yield from walk(node, path)


def _show(value: Any) -> str:
    if value is _MISSING:
        return ""
    return code(json.dumps(value, ensure_ascii=False))


def render() -> str:
    found = list(values())
    top = [v for v in found if "." not in v.path]
    sections = [v for v in top if any(w.path.startswith(v.path + ".") for w in found)]
    others = [v for v in top if v not in sections]
    parts = [HEADER.format(source="deploy/helm/ragr1/values.schema.json and values.yaml"), f"""# Helm values

The values of the chart in `deploy/helm/ragr1`. Helm checks every value against `values.schema.json`
(wrong types and unknown keys are refused at install, upgrade, template and lint); the defaults are those
of `values.yaml`. `values-cpu.yaml` (a CPU-only cluster) and `values-wikipedia.yaml` (the 21M-passage
Wikipedia index) are overlays on top of them (`helm install -f values-wikipedia.yaml …`).

Sections: {", ".join(f"[{v.path}](#{slug(v.path)})" for v in sections)}, [other values](#other-values).
"""]
    for section in sections:
        parts.append(f"\n## {section.path}\n\n{cell(section.description)}\n\n")
        rows = [[code(v.path), cell(v.type), _show(v.default), cell(v.description)]
                for v in found if v.path.startswith(section.path + ".")]
        parts.append(table(["Value", "Type", "Default", "Description"], rows))
    parts.append("\n## Other values\n\n")
    parts.append(table(["Value", "Type", "Default", "Description"],
                       [[code(v.path), cell(v.type), _show(v.default), cell(v.description)] for v in others]))
    return "".join(parts)
