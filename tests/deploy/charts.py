"""The Helm chart as Helm's own library renders it, and the parts of a rendered object the deploy tests
read (a component's first container, the index Job, a flag's value, a container's environment)."""

from __future__ import annotations

from typing import Any

import helm_python
import yaml

NAMESPACE = "rl"
# Everything optional that changes the pods' command lines, environment or mounts.
EVERYTHING_ON = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "tls": {"enabled": True, "secretName": "ragr1-tls", "mutual": True},
    "models": {"existingClaim": "models"},
}

helm_python.disable_logging()

Render = dict[tuple[str, str], dict[str, Any]]


def render(chart: helm_python.Chart, values: dict[str, Any] | None = None) -> Render:
    """(kind, name) -> object, for every manifest the chart renders with these values."""
    out: Render = {}
    for path, text in chart.render(values or {}, name="ragr1", namespace=NAMESPACE).items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in out, f"{key} rendered twice"
                out[key] = doc
    return out


def container(objects: Render, kind: str, name: str) -> dict[str, Any]:
    return objects[(kind, f"ragr1-{name}")]["spec"]["template"]["spec"]["containers"][0]


def index_job(objects: Render) -> dict[str, Any]:
    (job,) = [obj for (kind, name), obj in objects.items() if kind == "Job" and name.startswith("ragr1-index-build-")]
    return job


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
