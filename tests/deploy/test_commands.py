"""Every ``ragr1`` command line that docker-compose and the Helm chart run is one the real CLI accepts.

A flag renamed in a service's config dataclass breaks a deployment only at start-up, in a container;
here it breaks a test, and so does a subcommand that does not exist (a misspelt ``serve retreiver``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import shlex
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from ragr1.cli import build_parser
from tests.deploy.charts import EVERYTHING_ON, Render, container, index_job, render
from tests.deploy.compose import config
from tests.deploy.conftest import CHART, ragr1_invocations

# The image's entrypoint (docker/Dockerfile): containers without a command of their own run ragr1.
ENTRYPOINT = ["ragr1"]
# The chart's values whose command lines are checked: the defaults and everything that changes them.
CHART_VALUES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tls": EVERYTHING_ON,
    "ray": {"trainer": {"ray": {"enabled": True}}},
}

# What each command loads is in the image of these roles (targets of docker/Dockerfile, extras of
# pyproject.toml); the router also runs on the index image, which carries torch for an index built with
# --encoder-backend torch (values-wikipedia.yaml).
ROLES_OF = {
    ("serve", "reward"): {"reward"},
    ("serve", "retriever"): {"retriever", "index"},
    ("serve", "retriever-shard"): {"retriever"},
    ("corpus", "ingest"): {"index"},
    ("index", "build"): {"index"},
    ("serve", "policy"): {"policy"},
    ("serve", "rollout-worker"): {"policy"},
    ("train", "sft"): {"trainer"},
    ("train", "ppo"): {"trainer"},
}

# Where a container runs (``compose <service>``, ``helm <values> <object>[/<container>]``) -> the
# ``ragr1`` command lines it runs there.
Invocations = dict[str, list[list[str]]]


def compose_invocations(services: dict[str, Any]) -> Invocations:
    out = {}
    for name, service in services.items():
        if "build" not in service:
            continue  # redis, prometheus, grafana: not this project's image
        argv = (service.get("entrypoint") or ENTRYPOINT) + service.get("command", [])
        out[f"compose {name}"] = ragr1_invocations(argv)
    return out


def chart_invocations(label: str, objects: Render) -> Invocations:
    out: Invocations = {}
    for (kind, name), obj in objects.items():
        if kind == "RayJob":
            out[f"helm {label} {name}"] = ragr1_invocations(shlex.split(obj["spec"]["entrypoint"]))
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            if c["image"].startswith("redis"):
                continue
            argv = c.get("command", ENTRYPOINT) + c.get("args", [])
            out[f"helm {label} {name}/{c['name']}"] = ragr1_invocations(argv)
    return out


def parse(argv: list[str]) -> str:
    """What is wrong with ``ragr1 <argv>``: argparse's complaint (an unknown subcommand included), or
    that it names no command to run; "" if it would run."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = build_parser().parse_args(argv)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return "" if callable(getattr(args, "run", None)) else "parses, but names no command to run"


def problems(invocations: Invocations) -> dict[str, list[str]]:
    """Where -> what is wrong there: a container of this project's image that runs no ``ragr1`` command
    (its command line was not understood), and every command line the CLI refuses."""
    out: dict[str, list[str]] = {}
    for where, lines in invocations.items():
        if not lines:
            out.setdefault(where, []).append("runs no ragr1 command")
        for argv in lines:
            if error := parse(argv):
                out.setdefault(where, []).append(f"ragr1 {' '.join(argv)}\n  -> {error}")
    return out


def report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{where}: {problem}" for where, each in found.items() for problem in each)


@pytest.fixture(scope="module")
def compose_services() -> dict[str, Any]:
    return config("docker-compose.yml", "docker-compose.gpu.yml")["services"]


@pytest.fixture(scope="module")
def chart_renders() -> Iterator[dict[str, Render]]:
    chart = helm_python.Chart.load(CHART)
    try:
        yield {label: render(chart, values) for label, values in CHART_VALUES.items()}
    finally:
        chart.close()


@pytest.mark.parametrize("source", ["compose", "helm"])
def test_every_deployed_command_line_parses(source: str, request: pytest.FixtureRequest) -> None:
    if source == "compose":
        invocations = compose_invocations(request.getfixturevalue("compose_services"))
    else:
        renders: dict[str, Render] = request.getfixturevalue("chart_renders")
        invocations = {where: lines for label, objects in renders.items()
                       for where, lines in chart_invocations(label, objects).items()}
    assert invocations  # nothing collected would pass whatever the files say
    found = problems(invocations)
    assert not found, report(found)


def test_a_wrong_flag_or_a_misspelt_subcommand_is_caught(compose_services: dict[str, Any],
                                                         chart_renders: dict[str, Render]) -> None:
    """The check above can fail: the shipped compose file and chart, each with a few command lines
    spoilt, go through the same collection and parsing, and exactly the spoilt places are reported."""
    services = copy.deepcopy(compose_services)
    assert services["retriever"]["command"][:2] == ["serve", "retriever"]
    services["retriever"]["command"][1] = "retreiver"
    services["reward"]["command"].append("--no-such-flag")
    (script,) = services["index-build"]["command"]  # an `sh -c` script: found line by line
    assert "ragr1 index build " in script
    services["index-build"]["command"] = [script.replace("ragr1 index build ", "ragr1 index biuld ")]
    services["trainer"]["entrypoint"] = ["ragr"]  # a container that would not run ragr1 at all
    found = problems(compose_invocations(services))
    spoilt = {"compose retriever", "compose reward", "compose index-build", "compose trainer"}
    assert set(found) == spoilt, report(found)
    assert "invalid choice: 'retreiver'" in found["compose retriever"][0]
    assert "unrecognized arguments: --no-such-flag" in found["compose reward"][0]
    assert "invalid choice: 'biuld'" in found["compose index-build"][0]
    assert found["compose trainer"] == ["runs no ragr1 command"]

    objects = copy.deepcopy(chart_renders["ray"])
    container(objects, "Deployment", "retriever")["args"][1] = "retreiver"
    container(objects, "Deployment", "reward")["args"] += ["--no-such-flag", "1"]
    shard = container(objects, "StatefulSet", "retriever-shard")  # its flags come in as the script's "$@"
    shard["args"] = [*shard["args"], "--no-such-flag"]
    job = index_job(objects)["spec"]["template"]["spec"]["containers"][0]
    job["command"][2] = job["command"][2].replace("ragr1 corpus ingest ", "ragr1 corpus injest ")
    ray = objects[("RayJob", "ragr1-trainer")]["spec"]
    ray["entrypoint"] += " --no-such-flag"
    found = problems(chart_invocations("ray", objects))
    where = {
        "router": "helm ray ragr1-retriever/router",
        "reward": "helm ray ragr1-reward/reward",
        "shard": "helm ray ragr1-retriever-shard/shard",
        "job": f"helm ray {index_job(objects)['metadata']['name']}/index-build",
        "ray": "helm ray ragr1-trainer",
    }
    assert set(found) == set(where.values()), report(found)
    assert "invalid choice: 'retreiver'" in found[where["router"]][0]
    assert "unrecognized arguments: --no-such-flag 1" in found[where["reward"]][0]
    assert "unrecognized arguments: --no-such-flag" in found[where["shard"]][0]
    assert ["invalid choice: 'injest'" in p for p in found[where["job"]]] == [True]  # index build is fine
    assert "unrecognized arguments: --no-such-flag" in found[where["ray"]][0]


def test_parse_names_what_is_wrong() -> None:
    assert "unrecognized arguments" in parse(["redis", "--no-such-flag", "1"])
    assert "invalid choice: 'retreiver'" in parse(["serve", "retreiver", "--port", "1"])
    assert "invalid choice" in parse(["no-such-command"])
    assert "required: SERVICE" in parse(["serve"])
    assert parse(["serve", "retriever-shard", "--index", "x", "--shard", "0"]) == ""


def image_role(image: str) -> str:
    """``ragr1-index:cpu`` (or ``<registry>/ragr1-index:gpu``) -> ``index``."""
    name = image.rsplit("/", 1)[-1].split(":")[0]
    assert name.startswith("ragr1-"), image
    return name.removeprefix("ragr1-")


def chart_images(objects: Render) -> dict[str, tuple[str, list[list[str]]]]:
    """Where -> (the role of the image it runs, its ``ragr1`` command lines), init containers included."""
    out = {}
    for (kind, name), obj in objects.items():
        if kind == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            entry = ragr1_invocations(shlex.split(obj["spec"]["entrypoint"]))
            for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
                for c in group["template"]["spec"]["containers"]:
                    out[f"{name}/{group.get('groupName', 'head')}/{c['name']}"] = (image_role(c["image"]), entry)
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            if not c["image"].startswith("redis"):
                argv = c.get("command", ENTRYPOINT) + c.get("args", [])
                out[f"{name}/{c['name']}"] = (image_role(c["image"]), ragr1_invocations(argv))
    return out


def test_every_container_runs_the_image_of_the_role_its_command_needs(
    compose_services: dict[str, Any], chart_renders: dict[str, Render]
) -> None:
    """One image per role: a container whose command needs torch must not get the reward or retriever
    image (which have none), and compose builds each service's image from the target of its name."""
    used = set()
    for name, service in compose_services.items():
        if "build" not in service:
            continue
        role = service["build"]["target"]
        assert service["image"] == f"ragr1-{role}:cpu", name
        for argv in ragr1_invocations((service.get("entrypoint") or ENTRYPOINT) + service.get("command", [])):
            assert role in ROLES_OF[tuple(argv[:2])], (name, argv)
            used.add(role)
    assert used == {"reward", "retriever", "index", "policy", "trainer"}
    wikipedia = yaml.safe_load((CHART / "values-wikipedia.yaml").read_text())
    chart = helm_python.Chart.load(CHART)
    try:
        renders = {**chart_renders, "wikipedia": render(chart, wikipedia)}
    finally:
        chart.close()
    for label, objects in renders.items():
        images = chart_images(objects)
        for where, (role, lines) in images.items():
            for argv in lines:
                assert role in ROLES_OF[tuple(argv[:2])], (label, where, argv)
        roles = {role for role, _ in images.values()}
        assert roles == {"reward", "retriever", "index", "policy", "trainer"}, (label, roles)
    # An index with a torch encoder: its router runs the index image (the retriever image has no torch).
    assert chart_images(renders["wikipedia"])["ragr1-retriever/router"][0] == "index"
    assert chart_images(renders["defaults"])["ragr1-retriever/router"][0] == "retriever"
