"""The Grafana dashboards on disk and their panels' PromQL, as Prometheus would be sent it; shared by the
dashboard tests and the docker harness, which runs the same queries against the compose stack. Also the
metrics the code exports, which the dashboards and the alert rules may name."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

from prometheus_client import REGISTRY

from tests.deploy.conftest import DASHBOARDS, ROOT

# A metric's name in PromQL.
METRIC = re.compile(r"\bragr1_[a-z0-9_]+")
# Grafana's variables, as Grafana would fill them in for a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m"}


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def expressions() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) for every target of every panel."""
    out = []
    for name, board in dashboards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((name, panel["title"], target["expr"]))
    return out


def filled(expr: str) -> str:
    """The query with Grafana's variables filled in (Prometheus refuses them)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def defined_metrics() -> set[str]:
    """Every ragr1_* metric the code registers: import each module that uses prometheus_client, then
    read the registry (so names built from constants count too)."""
    for path in (ROOT / "ragr1").rglob("*.py"):
        if "prometheus_client" in path.read_text():
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("ragr1_"):
            names.update({family.name, family.name + "_total"} if family.type == "counter" else {family.name})
    return names
