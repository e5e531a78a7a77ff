"""The Helm chart on CPUs (values-cpu.yaml) and docker-compose.yml run the same stack: where they
disagree on a setting, one of them is wrong. Each service's settings are resolved as the service
itself resolves them (its config dataclass from flags and RAGR1_* environment variables), on both
sides, and compared field by field; the fields that must differ name their reason."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

import helm_python
import pytest
import yaml

from ragr1.services.common.config import add_arguments, load, settings_of
from ragr1.services.common.streams import QueueConfig
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.retriever.encoder import DEFAULT_ENCODER
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.config import PPOConfig
from tests.deploy.charts import env, render
from tests.deploy.compose import config as compose_config
from tests.deploy.conftest import CHART, ROOT, ragr1_invocations

# compose service -> (chart kind, chart component, the service's settings)
SERVICES = {
    "retriever-shard-0": ("StatefulSet", "retriever-shard", ShardConfig),
    "retriever": ("Deployment", "retriever", RouterConfig),
    "reward": ("Deployment", "reward", RewardConfig),
    "policy": ("Deployment", "policy", PolicyConfig),
    "trainer": ("Deployment", "trainer", PPOConfig),
}
# Settings that differ between a cluster and one machine, and why; compared as noted.
PLATFORM = {
    "shard": "a shard pod takes its number from its ordinal, a compose service from its flag",
    "shards": "shard addresses are cluster DNS names in the chart (compared: how many)",
    "search_threads": "a shard pod has cores of its own (the chart: its CPU request); compose's shards share one "
    "machine's cores, one FAISS thread each",
    "retriever_address": "service DNS names (compared: the port)",
    "reward_address": "service DNS names (compared: the port)",
    "redis_url": "service DNS names; the chart puts its Redis password in the URL (compared: a password on both sides)",
    "redis_password_file": "compose reads the Redis password from a secret file, the chart from its URL",
    "auth_token_file": "secrets mount at other paths (compared: set on both sides)",
    "worker_name": "the pod's name in the chart (compared: stable on both sides)",
    "drain_seconds": "Kubernetes takes longer than compose's DNS to stop sending traffic to a pod",
}


def memory_bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([a-zA-Z]*)", str(quantity)).groups()  # type: ignore[union-attr]
    scale = {"": 1, "k": 1000, "m": 2**20, "g": 2**30, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "mb": 2**20, "gb": 2**30}[
        unit
    ]
    return int(number) * scale


def seconds(duration: str) -> float:
    """A compose duration ("40s", "2m")."""
    number, unit = re.fullmatch(r"(\d+)(s|m)", duration).groups()  # type: ignore[union-attr]
    return int(number) * (60 if unit == "m" else 1)


def settings(cls: type, argv: list[str], variables: dict[str, Any]) -> Any:
    """The config a service builds from this command line and environment (what `ragr1 serve` does)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, cls)
    args = parser.parse_args(argv)
    overrides = {name: getattr(args, name) for name, _, _ in settings_of(cls)}
    strings = {k: v for k, v in variables.items() if isinstance(v, str)}
    return load(cls, env=strings, overrides=overrides)


def flags(argv: list[str]) -> list[str]:
    """The flags after `ragr1 serve <name>` / `ragr1 train ppo`."""
    return argv[2:]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return compose_config("docker-compose.yml", "docker-compose.auth.yml")["services"]


@pytest.fixture(scope="module")
def chart() -> dict[tuple[str, str], dict[str, Any]]:
    loaded = helm_python.Chart.load(CHART)
    try:
        return render(loaded, yaml.safe_load((CHART / "values-cpu.yaml").read_text()))
    finally:
        loaded.close()


def pod(chart: dict[tuple[str, str], dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    return chart[(kind, f"ragr1-{component}")]["spec"]["template"]["spec"]


def chart_argv(container: dict[str, Any]) -> list[str]:
    (argv,) = ragr1_invocations([*container.get("command", ["ragr1"]), *container["args"]])
    return argv


@pytest.mark.parametrize("service", list(SERVICES))
def test_every_setting_of_every_service_agrees(compose: dict[str, Any], chart: Any, service: str) -> None:
    kind, component, cls = SERVICES[service]
    ours = compose[service]
    theirs = pod(chart, kind, component)["containers"][0]
    on_compose = settings(cls, flags(ours["command"]), ours["environment"])
    on_chart = settings(cls, flags(chart_argv(theirs)), env(theirs))
    differ = {f.name for f in dataclasses.fields(cls) if getattr(on_compose, f.name) != getattr(on_chart, f.name)}
    assert differ <= set(PLATFORM), {n: (getattr(on_compose, n), getattr(on_chart, n)) for n in differ - set(PLATFORM)}

    # Neither side kills a server before its drain and grace periods are over.
    assert seconds(ours["stop_grace_period"]) >= on_compose.drain_seconds + on_compose.grace_seconds
    assert pod(chart, kind, component).get("terminationGracePeriodSeconds", 30) >= (
        on_chart.drain_seconds + on_chart.grace_seconds
    )
    assert bool(on_compose.auth_token_file) and bool(on_chart.auth_token_file), "auth on both sides"
    for side, variables in (("compose", ours["environment"]), ("chart", env(theirs))):
        assert variables["RAGR1_CLIENT_TOKEN_FILE"] == variables["RAGR1_AUTH_TOKEN_FILE"], side
    if isinstance(on_compose, QueueConfig):  # Redis AUTH on both sides, each its own way
        assert on_compose.redis_password_file and re.match(r"redis://:[^@]+@", on_chart.redis_url)
    if cls is RouterConfig:  # compose names every shard of the index with one address
        count = len(on_chart.shards)
        assert len(on_compose.shard_addresses(count)) == len(on_chart.shard_addresses(count)) == count
    for name in ("retriever_address", "reward_address"):
        if hasattr(on_compose, name):
            assert getattr(on_compose, name).rsplit(":")[-1] == getattr(on_chart, name).rsplit(":")[-1]


def test_the_rollout_worker_has_a_name_of_its_own_per_replica(compose: dict[str, Any], chart: Any) -> None:
    # Compose: none set, so each container of `--scale policy=N` names itself by its hostname (its id).
    assert "RAGR1_WORKER_NAME" not in compose["policy"]["environment"]
    policy = pod(chart, "Deployment", "policy")["containers"][0]
    # The pod's name: unique in the Deployment, and kept across restarts of the container in its pod.
    assert env(policy)["RAGR1_WORKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_memory_for_the_trainer_and_shared_memory_agree(compose: dict[str, Any], chart: Any) -> None:
    trainer = pod(chart, "Deployment", "trainer")
    assert memory_bytes(compose["trainer"]["mem_limit"]) == memory_bytes(
        trainer["containers"][0]["resources"]["limits"]["memory"]
    )
    for service in ("policy", "trainer"):
        (shm,) = [v for v in pod(chart, "Deployment", service)["volumes"] if v["name"] == "shm"]
        assert memory_bytes(compose[service]["shm_size"]) == memory_bytes(shm["emptyDir"]["sizeLimit"]), service


def test_images_index_and_scratch_space_agree(compose: dict[str, Any], chart: Any) -> None:
    shard = pod(chart, "StatefulSet", "retriever-shard")["containers"][0]
    assert compose["retriever"]["image"] == shard["image"]
    redis = pod(chart, "StatefulSet", "redis")["containers"][0]
    assert compose["redis"]["image"] == redis["image"]

    (build_job,) = [o for (kind, name), o in chart.items() if kind == "Job" and name.startswith("ragr1-index-build")]
    job = build_job["spec"]["template"]["spec"]["containers"][0]
    index = {
        "chart": ragr1_invocations(job["command"])[-1],
        "compose": ragr1_invocations(compose["index-build"]["entrypoint"] + compose["index-build"]["command"])[-1],
    }
    for side, argv in index.items():
        assert argv[:2] == ["index", "build"], side

    def option(argv: list[str], flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv else default

    for flag, default in (("--index-type", "flat"), ("--encoder", DEFAULT_ENCODER)):
        assert option(index["chart"], flag, default).strip('"') == option(index["compose"], flag, default), flag
    # Compose says its shard count once, in the index build's environment (docker-compose.yml's x-num-shards).
    shards = compose["index-build"]["environment"]["RAGR1_NUM_SHARDS"]
    assert "--num-shards" not in index["compose"]
    assert option(index["chart"], "--num-shards", "1").strip('"') == shards
    assert int(shards) == sum(s.startswith("retriever-shard-") for s in compose)

    # A writable, executable /tmp in every ragr1 container: inductor loads what it compiles from there.
    for service in SERVICES:
        assert any(t.split(":")[0] == "/tmp" and "noexec" not in t for t in compose[service]["tmpfs"]), service
        kind, component, _ = SERVICES[service]
        spec = pod(chart, kind, component)
        (tmp,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert {"name": tmp["name"], "emptyDir": {}} in spec["volumes"], service


def test_compose_builds_from_the_dockerfile_default_base() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.MULTILINE)
    stack = compose_config("docker-compose.yml")["services"]
    assert stack["reward"]["build"]["args"]["BASE_IMAGE"] == default
