"""Every ``ragr1`` command line that docker-compose and the Helm chart run is one the real CLI accepts.

A flag renamed in a service's config dataclass breaks a deployment only at start-up, in a container;
here it breaks a test, and so does a subcommand that does not exist (a misspelt ``serve retreiver``).
"""

from __future__ import annotations

import contextlib
import io
import shlex

import helm_python
import pytest

from ragr1.cli import build_parser
from tests.deploy.charts import EVERYTHING_ON, render
from tests.deploy.compose import config
from tests.deploy.conftest import CHART, ragr1_invocations

# The image's entrypoint (docker/Dockerfile): containers without a command of their own run ragr1.
ENTRYPOINT = ["ragr1"]


def compose_invocations() -> dict[str, list[list[str]]]:
    out = {}
    for name, service in config("docker-compose.yml", "docker-compose.gpu.yml")["services"].items():
        if "build" not in service:
            continue  # redis, prometheus, grafana: not this project's image
        argv = (service.get("entrypoint") or ENTRYPOINT) + service.get("command", [])
        out[f"compose {name}"] = ragr1_invocations(argv)
    return out


def helm_invocations() -> dict[str, list[list[str]]]:
    chart = helm_python.Chart.load(CHART)
    out: dict[str, list[list[str]]] = {}
    try:
        ray = {"trainer": {"ray": {"enabled": True}}}
        for label, values in (("defaults", {}), ("tls", EVERYTHING_ON), ("ray", ray)):
            for (kind, name), obj in render(chart, values).items():
                if kind == "RayJob":
                    out[f"helm {label} {name}"] = ragr1_invocations(shlex.split(obj["spec"]["entrypoint"]))
                if kind not in ("Deployment", "StatefulSet", "Job"):
                    continue
                for c in obj["spec"]["template"]["spec"]["containers"]:
                    if c["image"].startswith("redis"):
                        continue
                    argv = c.get("command", ENTRYPOINT) + c.get("args", [])
                    out[f"helm {label} {name}/{c['name']}"] = ragr1_invocations(argv)
    finally:
        chart.close()
    return out


def parse(argv: list[str]) -> str:
    """argparse's complaint about ``ragr1 <argv>`` (an unknown subcommand included), or "" if it parses."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(argv)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return ""


@pytest.mark.parametrize("source", ["compose", "helm"])
def test_every_deployed_command_line_parses(source: str) -> None:
    invocations = compose_invocations() if source == "compose" else helm_invocations()
    commands: list[tuple[str, list[str]]] = [(where, argv) for where, lines in invocations.items() for argv in lines]
    # Every ragr1 container was found and runs something.
    assert all(invocations.values()), [where for where, lines in invocations.items() if not lines]
    errors = [f"{where}: ragr1 {' '.join(argv)}\n  -> {error}" for where, argv in commands if (error := parse(argv))]
    assert not errors, "\n".join(errors)


def test_a_wrong_flag_or_a_misspelt_subcommand_is_caught() -> None:
    """The check above can fail: a flag no parser knows and a subcommand that does not exist are reported."""
    assert "unrecognized arguments" in parse(["redis", "--no-such-flag", "1"])
    assert "invalid choice: 'retreiver'" in parse(["serve", "retreiver", "--port", "1"])
    assert "invalid choice" in parse(["no-such-command"])
    assert parse(["serve", "retriever-shard", "--index", "x", "--shard", "0"]) == ""
