"""The Grafana dashboards: in step with their generator, charting metrics the code exports, and every
panel's PromQL accepted by a real Prometheus scraping a real server built on the common runtime."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ragr1.services.common.client import open_channel
from ragr1.services.common.redis_server import free_port
from ragr1.v1 import trainer_pb2, trainer_pb2_grpc
from tests.common.status_process import start_server
from tests.common.waiting import wait_for
from tests.deploy.conftest import DASHBOARDS, ROOT, load_dashboard_generator, tool
from tests.deploy.dashboards import METRIC, dashboards, defined_metrics, expressions, filled

HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def test_dashboards_are_what_the_generator_writes() -> None:
    generated = load_dashboard_generator().files()
    on_disk = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert on_disk == generated, "dashboards are stale: run python deploy/grafana/generate.py"
    assert set(generated) == {"ragr1-overview.json", "ragr1-retriever.json", "ragr1-policy.json",
                              "ragr1-trainer.json"}


def test_every_panel_has_a_unique_id_and_a_query() -> None:
    for name, board in dashboards().items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        charts = [p for p in board["panels"] if p["type"] != "row"]
        assert charts and all(p["targets"] for p in charts), name
        assert all(p["datasource"]["uid"] == "${datasource}" for p in charts), name


def _exporter(metric: str) -> str | None:
    """The service whose ``metrics.py`` exports ``metric``, or None for the common runtime's metrics."""
    component = metric.split("_")[1]
    return component if (ROOT / "ragr1" / "services" / component).is_dir() else None


def test_dashboards_chart_only_metrics_the_code_exports() -> None:
    defined = defined_metrics()
    missing = []
    for name, title, expr in expressions():
        for metric in METRIC.findall(expr):
            base = metric
            for suffix in HISTOGRAM_SERIES:
                if metric.endswith(suffix) and metric[: -len(suffix)] in defined:
                    base = metric[: -len(suffix)]
            service = _exporter(metric)
            # A service's metrics can only be checked in a tree that has its metrics module.
            if service is not None and not (ROOT / "ragr1" / "services" / service / "metrics.py").exists():
                continue
            if base not in defined:
                missing.append(f"{name} / {title}: {metric}")
    assert not missing, "charted but exported nowhere:\n" + "\n".join(missing)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _query(base: str, expr: str) -> dict[str, Any]:
    try:
        return _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except urllib.error.HTTPError as exc:  # Prometheus answers a bad query with 400 and the reason
        return json.loads(exc.read())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server on the common runtime (with a few OK and failed calls) and a Prometheus scraping it."""
    tmp = tmp_path_factory.mktemp("prometheus")
    port, metrics_port, prom_port = free_port(), free_port(), free_port()
    with start_server(tmp, port, metrics_port=metrics_port):
        stub = trainer_pb2_grpc.TrainerStub(open_channel(f"127.0.0.1:{port}"))
        for _ in range(3):
            stub.Status(trainer_pb2.StatusRequest(), timeout=5)
        with pytest.raises(grpc.RpcError):
            stub.Status(trainer_pb2.StatusRequest(), metadata=(("x-delay", "-1"),), timeout=5)
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: ragr1\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
        )
        check = subprocess.run([tool("promtool"), "check", "config", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        log = (tmp / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:

            # Ready once two scrapes of the server have landed, so that rate() has something to work on.
            def scraped_twice() -> bool:
                assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
                try:
                    samples = _query(base, "count_over_time(ragr1_grpc_server_serving[1m])")["data"]["result"]
                except (OSError, KeyError, ValueError):  # ValueError: 503 while it starts
                    return False
                return bool(samples) and float(samples[0]["value"][1]) >= 2

            wait_for(scraped_twice, "Prometheus never scraped the server twice", 30, 0.3)
            yield base
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            log.close()


def test_prometheus_accepts_every_panel_query(prometheus: str) -> None:
    errors = []
    for name, title, expr in expressions():
        reply = _query(prometheus, filled(expr))
        if reply.get("status") != "success":
            errors.append(f"{name} / {title}: {expr}\n  -> {reply.get('error')}")
    assert not errors, "\n".join(errors)


def test_overview_panels_show_the_common_runtime_metrics(prometheus: str) -> None:
    """Every overview chart has data from a server that only uses the common runtime."""
    board = dashboards()["ragr1-overview.json"]
    empty = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            if "ragr1_queue_events_total" in target["expr"]:
                continue  # the queue is not used by this server
            if not _query(prometheus, filled(target["expr"]))["data"]["result"]:
                empty.append(panel["title"])
    assert not empty, f"no data for: {empty}"
    errors = _query(prometheus, filled(next(
        t["expr"] for p in board["panels"] if p["title"] == "Errors by status code" for t in p["targets"])))
    assert {r["metric"]["code"] for r in errors["data"]["result"]} == {"INVALID_ARGUMENT"}
