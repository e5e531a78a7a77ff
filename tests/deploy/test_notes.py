"""What ``helm install`` prints (NOTES.txt) names only objects the chart renders: a ``kind/name`` a kubectl
command takes, a label selector (``-l``), a Service host a grpcurl or curl command calls, a Secret."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest

from tests.deploy.charts import NAMESPACE, render

KINDS = {"job": "Job", "deployment": "Deployment", "statefulset": "StatefulSet", "service": "Service",
         "svc": "Service", "secret": "Secret", "configmap": "ConfigMap"}


def notes(chart: helm_python.Chart, values: dict[str, Any]) -> str:
    rendered = chart.render(values, name="ragr1", namespace=NAMESPACE)
    (text,) = [t for path, t in rendered.items() if path.endswith("NOTES.txt")]
    return text


def labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


@pytest.mark.parametrize("values", [{}, {"auth": {"enabled": True}}, {"index": {"build": {"enabled": False}}}],
                         ids=["defaults", "auth", "no-index-build"])
def test_notes_name_only_objects_the_chart_renders(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    text = notes(chart, values)
    names = {(kind, name) for kind, name in objects}
    checked = 0
    for kind, name in re.findall(r"\b(job|deployment|statefulset|service|svc|secret|configmap)/([\w.-]+)", text):
        assert (KINDS[kind], name) in names, f"NOTES.txt names {kind}/{name}, which the chart does not render"
        checked += 1
    for selector in re.findall(r"(?:-l|--selector)[ =](\S+)", text):
        wanted = dict(pair.split("=", 1) for pair in selector.split(","))
        matching = [key for key, obj in objects.items() if wanted.items() <= labels(obj).items()]
        assert matching, f"NOTES.txt's selector {selector} matches nothing the chart renders"
        checked += 1
    for host in re.findall(r"(?:grpcurl[^\n]*?|http://)([a-z][\w-]*):\d+", text):
        assert ("Service", host) in names, f"NOTES.txt calls {host}, which is no Service of the chart"
        checked += 1
    for secret in re.findall(r"Secret ([\w.-]+)", text):
        assert ("Secret", secret) in names, f"NOTES.txt names Secret {secret}, which the chart does not render"
        checked += 1
    assert checked >= 2, text


def test_the_index_job_is_found_by_the_notes_selector(chart: helm_python.Chart) -> None:
    """The Job's name carries a hash of its settings; the selector NOTES gives finds it and nothing else."""
    objects = render(chart)
    (selector,) = re.findall(r"logs -f -l (\S+)", notes(chart, {}))
    wanted = dict(pair.split("=", 1) for pair in selector.split(","))
    matching = [name for (kind, name), obj in objects.items() if wanted.items() <= labels(obj).items()]
    assert len(matching) == 1 and matching[0].startswith("ragr1-index-build-"), matching
    # The pods too: ``kubectl logs -l`` selects pods, not the Job.
    pod_labels = objects[("Job", matching[0])]["spec"]["template"]["metadata"]["labels"]
    assert wanted.items() <= pod_labels.items()
