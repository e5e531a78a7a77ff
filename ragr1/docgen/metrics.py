"""``docs/reference/metrics.md``: every Prometheus metric, read from the collectors the code defines.

The modules that use ``prometheus_client`` are imported and their module-level collectors read (name, type,
labels, help), so a metric is listed exactly as the process exports it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from ragr1.docgen.markdown import HEADER, ROOT, cell, code, slug, table

# Who exports the metrics of each module that defines some (a new module must be added here).
COMPONENTS: dict[str, tuple[str, str]] = {
    "ragr1.services.common.metrics": (
        "Every gRPC server", "Each `ragr1 serve …` process and the PPO trainer, labelled by gRPC service."),
    "ragr1.services.common.streams": (
        "The Redis streams", "Every process on the queue: the rollout workers and the PPO trainer."),
    "ragr1.services.retriever.metrics": (
        "Retriever", "`ragr1 serve retriever` (the router) and `ragr1 serve retriever-shard` (a shard): the help "
        "says which."),
    "ragr1.services.policy.metrics": (
        "Policy", "`ragr1 serve policy` and `ragr1 serve rollout-worker`."),
    "ragr1.services.reward.metrics": ("Reward", "`ragr1 serve reward`."),
    "ragr1.services.trainer.metrics": ("Trainer", "`ragr1 train ppo`."),
}
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
_SUFFIX = {"counter": "_total"}


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # as scraped: a counter's with _total
    type: str
    labels: tuple[str, ...]
    help: str
    module: str
    buckets: tuple[float, ...] = ()


def metric_modules() -> list[str]:
    """Every module of ``ragr1`` that uses prometheus_client."""
    package = ROOT / "ragr1"
    found = []
    for path in sorted(package.rglob("*.py")):
        if "v1" in path.relative_to(package).parts[:1]:
            continue
        if "prometheus_client" in path.read_text():
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def metrics() -> list[Metric]:
    """Every metric the code defines at module level, by module and then in definition order."""
    out = []
    for name in metric_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                kind = str(value._type)
                upper = getattr(value, "_upper_bounds", ())
                out.append(Metric(
                    name=value._name + _SUFFIX.get(kind, ""), type=kind, labels=tuple(value._labelnames),
                    help=str(value._documentation), module=name,
                    buckets=tuple(b for b in upper if b != float("inf")),
                ))
    return out


def dashboard_uses() -> dict[str, list[str]]:
    """Metric name -> titles of the dashboards whose queries read it."""
    uses: dict[str, list[str]] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        queries = " ".join(t.get("expr", "") for p in board.get("panels", []) for t in p.get("targets", []))
        for name in set(re.findall(r"\bragr1_[a-z0-9_]+", queries)):
            uses.setdefault(name, []).append(board["title"])
    return uses


def _series_names(metric: Metric) -> list[str]:
    if metric.type == "histogram":
        return [metric.name + s for s in ("_bucket", "_sum", "_count")]
    return [metric.name]


def render() -> str:
    found = metrics()
    unknown = sorted({m.module for m in found} - set(COMPONENTS))
    if unknown:
        raise RuntimeError(f"modules define metrics but are not in ragr1.docgen.metrics.COMPONENTS: {unknown}")
    uses = dashboard_uses()
    sections = [k for k in COMPONENTS if any(m.module == k for m in found)]
    parts = [HEADER.format(source="the prometheus_client collectors in ragr1/"), f"""# Metrics

Every process serves Prometheus metrics on `/metrics` (a server's `--metrics-port`; by default its gRPC port
+ 1000). Names follow `ragr1_<component>_<what>_<unit>`, in base units (seconds, bytes); latencies are
histograms, whose series are `<name>_bucket`, `<name>_sum` and `<name>_count`. The Dashboards column names the
Grafana dashboards (`deploy/grafana/dashboards/`) that chart a metric.

{len(found)} metrics: {", ".join(f"[{COMPONENTS[k][0]}](#{slug(COMPONENTS[k][0])})" for k in sections)}.
"""]
    for key in sections:
        title, who = COMPONENTS[key]
        rows = []
        for m in (m for m in found if m.module == key):
            charted = sorted({d for s in _series_names(m) for d in uses.get(s, [])})
            rows.append([code(m.name), m.type, ", ".join(code(label) for label in m.labels), cell(m.help),
                         cell(", ".join(charted))])
        parts.append(f"\n## {title}\n\n{who} Defined in `{Path(*key.split('.')).as_posix()}.py`.\n\n")
        parts.append(table(["Metric", "Type", "Labels", "Help", "Dashboards"], rows))
    return "".join(parts)
