"""The chart's values for the 21M-passage Wikipedia (``values-wikipedia.yaml``): they render, and the
commands they give the index Job, shards and router are ones the ``ragr1`` CLI accepts."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python
import pytest
import yaml

from ragr1.cli import build_parser
from tests.deploy.charts import arg, container, index_job, render
from tests.deploy.conftest import CHART, ragr1_invocations


@pytest.fixture(scope="module")
def objects() -> Iterator[dict]:
    chart = helm_python.Chart.load(CHART)
    values = yaml.safe_load((CHART / "values-wikipedia.yaml").read_text())
    values["models"] = {"existingClaim": "models"}
    yield render(chart, values)
    chart.close()


def test_wikipedia_values_shard_flat_bge_large_over_eight_gpus(objects: dict) -> None:
    assert objects[("StatefulSet", "ragr1-retriever-shard")]["spec"]["replicas"] == 8
    shard = container(objects, "StatefulSet", "retriever-shard")
    assert shard["resources"]["limits"]["nvidia.com/gpu"] == 1
    build = index_job(objects)["spec"]["template"]["spec"]["containers"][0]
    _, index = ragr1_invocations(build["command"] + build.get("args", []))
    assert (arg(index, "--index-type"), arg(index, "--encoder"), arg(index, "--encoder-backend")) == (
        "flat",
        "/models/bge-large-en-v1.5",
        "torch",
    )
    router = container(objects, "Deployment", "retriever")
    assert arg(router["args"], "--device") == "cuda"
    # A torch-backend index names its encoder by its directory: the router must see /models.
    assert "/models" in {m["mountPath"] for m in router["volumeMounts"]}
    parser = build_parser()
    for argv in (index, *ragr1_invocations(shard["command"] + shard.get("args", []))):
        parser.parse_args([a.replace("$RAGR1_SHARD", "0") for a in argv])
