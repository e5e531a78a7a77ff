"""The package's shape: files a reader can hold, and imports that only run down the layers.

Layers, bottom up: ``ragr1.v1`` (generated stubs) and ``ragr1.protocol`` (the text protocol) import no other
part; ``ragr1.services.common`` imports no service; a service reaches another only through that one's
``client`` module; no service imports the stack (``ragr1.stack``), the CLI or the docs generator. And no
import cycle anywhere, lazy imports inside functions included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ragr1"
MOST_LINES = 500
SERVICES = ("retriever", "policy", "reward", "trainer")


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The ragr1 modules ``path`` imports (a name imported from a package counts as its module if it is one)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("ragr1"):
                yield name


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(path, known)) - {name} for name, path in known.items()}


def part(module: str) -> str:
    """``ragr1.services.policy.agent`` -> ``policy``; ``ragr1.stack.demo`` -> ``stack``."""
    pieces = module.split(".")
    if len(pieces) > 2 and pieces[1] == "services":
        return pieces[2]
    return pieces[1] if len(pieces) > 1 else "ragr1"


def test_no_file_in_the_package_is_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if "v1" not in p.parts and (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert not long


def test_imports_run_down_the_layers() -> None:
    wrong = []
    for module, targets in graph().items():
        for target in targets:
            here, there = part(module), part(target)
            if here in ("v1", "protocol") and there != here and there != "v1":
                wrong.append((module, target, "the protocol and the stubs stand alone"))
            elif here == "common" and there in (*SERVICES, "stack", "cli", "docgen"):
                wrong.append((module, target, "common code imports no service"))
            elif here in SERVICES and there in SERVICES and there != here and not target.endswith(".client"):
                wrong.append((module, target, "another service only through its client"))
            elif here in (*SERVICES, "common", "protocol") and there in ("stack", "cli", "docgen"):
                wrong.append((module, target, "a service imports nothing above it"))
    assert not wrong


def test_no_import_cycle() -> None:
    edges = graph()
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles
