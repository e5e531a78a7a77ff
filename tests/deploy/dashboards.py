"""The Grafana dashboards on disk and their panels' PromQL, as Prometheus would be sent it; shared by the
dashboard tests and the docker harness, which runs the same queries against the compose stack."""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.conftest import DASHBOARDS

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
