"""The Helm chart, rendered by Helm's own library and validated against the Kubernetes schemas offline,
with the properties a cluster user relies on checked on the rendered objects."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from ragr1.services.common import ports
from ragr1.services.common.server import LIVENESS
from ragr1.services.policy.agent import MAX_MODEL_LEN
from tests.deploy.charts import EVERYTHING_ON, NAMESPACE, Render, arg, container, env, index_job, render
from tests.deploy.conftest import CHART, DASHBOARDS, ragr1_invocations

KUBE_VERSION = "1.30.0"
# Kinds from operators (no schema in kubernetes-validate): the fields their controllers need.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("selector", "endpoints"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("groups",),
    ("ray.io/v1", "RayJob"): ("entrypoint", "rayClusterSpec"),
    ("keda.sh/v1alpha1", "ScaledObject"): ("scaleTargetRef", "triggers"),
}
SERVERS = {"retriever-shard": ports.RETRIEVER_SHARD, "retriever": ports.RETRIEVER, "reward": ports.REWARD,
           "policy": ports.POLICY, "trainer": ports.TRAINER}


def pod_specs(objects: Render) -> Iterator[tuple[str, dict[str, Any]]]:
    for (kind, name), obj in objects.items():
        if kind in ("Deployment", "StatefulSet", "Job"):
            yield name, obj["spec"]["template"]["spec"]
        elif kind == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            yield f"{name}-head", cluster["headGroupSpec"]["template"]["spec"]
            for group in cluster["workerGroupSpecs"]:
                yield f"{name}-{group['groupName']}", group["template"]["spec"]


AUTOSCALING = {"enabled": True, "prometheusAddress": "http://prometheus:9090", "kedaVersion": "2.17.0"}


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON, {"trainer": {"ray": {"enabled": True}}},
                                    {"redis": {"enabled": False, "url": "redis://redis.example:6379/0"},
                                     "auth": {"enabled": False}, "networkPolicy": {"enabled": False}},
                                    {**EVERYTHING_ON, "policy": {"autoscaling": AUTOSCALING}},
                                    {"policy": {"autoscaling": AUTOSCALING},
                                     "redis": {"enabled": False, "url": "rediss://:secret@redis.example:6380/1"}}],
                         ids=["defaults", "tls-servicemonitor-models", "ray", "external-redis-no-auth",
                              "autoscaling-tls", "autoscaling-external-redis"])
def test_every_manifest_is_valid_kubernetes(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    for (kind, name), obj in objects.items():
        custom = CUSTOM_KINDS.get((obj["apiVersion"], kind))
        if custom is not None:
            assert all(field in obj["spec"] for field in custom), (kind, name)
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{kind}/{name}: {exc.message} at {list(exc.path)}") from exc


@pytest.mark.parametrize("values", [{}, {**EVERYTHING_ON, "trainer": {"ray": {"enabled": True}},
                                         "policy": {"autoscaling": AUTOSCALING}}],
                         ids=["defaults", "everything-on"])
def test_helm_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert not report["errors"], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_chart_ports_are_the_ports_module() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["ports"]
    assert values == {
        "retriever": ports.RETRIEVER, "policy": ports.POLICY, "reward": ports.REWARD, "trainer": ports.TRAINER,
        "retrieverShard": ports.RETRIEVER_SHARD, "retrieverHttp": ports.RETRIEVER_HTTP,
        "metricsOffset": ports.METRICS_OFFSET,
    }


def test_chart_serves_and_trains_the_policys_default_model_at_its_context_length() -> None:
    values = {name: yaml.safe_load((CHART / name).read_text()) for name in ("values.yaml", "values-cpu.yaml")}
    # Empty: SmolLM2 from the image for both (models.policy_checkpoint), so the trainer pushes what the policy serves.
    assert values["values.yaml"]["policy"]["model"] == values["values.yaml"]["trainer"]["model"] == ""
    assert {name: v["policy"]["maxModelLen"] for name, v in values.items()} == dict.fromkeys(values, MAX_MODEL_LEN)


def test_servers_listen_probe_and_expose_metrics_on_the_same_ports(chart: helm_python.Chart) -> None:
    objects = render(chart, {"metrics": {"serviceMonitor": {"enabled": True}}})
    for component, port in SERVERS.items():
        kind = "StatefulSet" if component == "retriever-shard" else "Deployment"
        c = container(objects, kind, component)
        assert arg(c["args"], "--port") == str(port), component
        assert {p["name"]: p["containerPort"] for p in c["ports"]}.items() >= {
            "grpc": port, "metrics": port + ports.METRICS_OFFSET}.items(), component
        # Readiness: the server's own status; startup and liveness: the process is up (server.LIVENESS).
        assert c["readinessProbe"]["grpc"] == {"port": port}, component
        for probe in ("startupProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": port, "service": LIVENESS}, (component, probe)
        service = objects[("Service", f"ragr1-{component}")]
        assert service["metadata"]["labels"]["ragr1.io/metrics"] == "true"
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["metrics"] == port + ports.METRICS_OFFSET
    monitor = objects[("ServiceMonitor", "ragr1")]
    assert monitor["spec"]["selector"]["matchLabels"]["ragr1.io/metrics"] == "true"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_shard_count_sets_replicas_router_fan_out_and_the_index_build(chart: helm_python.Chart) -> None:
    corpus = ["/models/part 1.jsonl.gz", "/models/part-2.jsonl.gz"]
    objects = render(chart, {"retriever": {"shards": 5}, "index": {"type": "ivfpq", "corpus": {"input": corpus}}})
    shards = objects[("StatefulSet", "ragr1-retriever-shard")]
    assert shards["spec"]["replicas"] == 5
    router = container(objects, "Deployment", "retriever")
    expected = [f"ragr1-retriever-shard-{i}.ragr1-retriever-shard.{NAMESPACE}.svc:{ports.RETRIEVER_SHARD}"
                for i in range(5)]
    assert arg(router["args"], "--shards").split(",") == expected
    build = index_job(objects)["spec"]["template"]["spec"]["containers"][0]
    ingest, index = ragr1_invocations(build["command"] + build.get("args", []))
    assert ingest[:2] == ["corpus", "ingest"] and index[:2] == ["index", "build"]
    assert (arg(index, "--num-shards"), arg(index, "--index-type")) == ("5", "ivfpq")
    assert arg(ingest, "--input").split(",") == corpus  # a list setting is one comma-separated value


def test_index_job_builds_once_per_settings(chart: helm_python.Chart, tmp_path: Path) -> None:
    """Runs the Job's real script against a directory, with a stand-in ``ragr1`` that logs its calls and
    writes what the real commands write last (the store's and the index's marker files)."""
    fake = tmp_path / "bin" / "ragr1"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$1 $2" >> "$INDEX_DIR/calls"\n'
                    'if [ "$1" = corpus ]; then mkdir -p "$INDEX_DIR/store"\n'
                    'else touch "$INDEX_DIR/manifest.json"; fi\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    index_dir = tmp_path / "index"
    index_dir.mkdir()

    def run_job(values: dict[str, Any]) -> tuple[str, list[str]]:
        job = index_job(render(chart, values))
        c = job["spec"]["template"]["spec"]["containers"][0]
        variables = {**os.environ, **{k: v for k, v in env(c).items() if isinstance(v, str)},
                     "INDEX_DIR": str(index_dir), "PATH": f"{fake.parent}:{os.environ['PATH']}"}
        result = subprocess.run([*c["command"], *c.get("args", [])], env=variables, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        calls = (index_dir / "calls").read_text().splitlines() if (index_dir / "calls").exists() else []
        (index_dir / "calls").unlink(missing_ok=True)
        return job["metadata"]["name"], calls

    first, calls = run_job({})
    assert calls == ["corpus ingest", "index build"]
    again, calls = run_job({})
    assert (again, calls) == (first, [])  # same settings: same Job, nothing to do
    resharded, calls = run_job({"retriever": {"shards": 4}})
    assert resharded != first and calls == ["index build"]  # a new Job; the passage store is reused
    _, calls = run_job({"retriever": {"shards": 4}, "index": {"corpus": {"input": ["/models/wiki.jsonl.gz"]}}})
    assert calls == ["corpus ingest", "index build"]


def test_each_shard_pod_serves_the_shard_of_its_ordinal(chart: helm_python.Chart, tmp_path: Path) -> None:
    """Runs the shard container's real command line with a stand-in ``ragr1`` that reports what it got."""
    shard = container(render(chart), "StatefulSet", "retriever-shard")
    fake = tmp_path / "ragr1"
    fake.write_text('#!/bin/sh\necho "shard=$RAGR1_SHARD args=$*"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    for pod, expected in (("ragr1-retriever-shard-0", "0"), ("ragr1-retriever-shard-13", "13")):
        result = subprocess.run([*shard["command"], *shard["args"]], capture_output=True, text=True, timeout=30,
                                env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "POD_NAME": pod})
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [f"shard={expected}", "args=serve", "retriever-shard", *shard["args"]]
    assert env(shard)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def gpus(c: dict[str, Any]) -> tuple[Any, Any]:
    resources = c.get("resources", {})
    return resources.get("requests", {}).get("nvidia.com/gpu"), resources.get("limits", {}).get("nvidia.com/gpu")


def test_gpu_requests(chart: helm_python.Chart) -> None:
    objects = render(chart, {"policy": {"gpus": 4, "replicas": 3}})
    policy = container(objects, "Deployment", "policy")
    assert gpus(policy) == (4, 4)
    assert arg(policy["args"], "--tensor-parallel-size") == "4"
    assert objects[("Deployment", "ragr1-policy")]["spec"]["replicas"] == 3
    assert gpus(container(objects, "StatefulSet", "retriever-shard")) == (1, 1)
    assert gpus(container(objects, "Deployment", "trainer")) == (1, 1)
    assert gpus(container(objects, "Deployment", "reward")) == (None, None)
    # The trainer needs no replica's address: the replicas follow the versions it announces in Redis.
    assert "--policy-replicas" not in container(objects, "Deployment", "trainer")["args"]
    cpu_only = container(render(chart, {"policy": {"gpus": 0}}), "Deployment", "policy")
    assert gpus(cpu_only) == (None, None)
    assert arg(cpu_only["args"], "--tensor-parallel-size") == "1"


def test_ray_trainer_is_a_rayjob_with_gpu_workers(chart: helm_python.Chart) -> None:
    objects = render(chart, {"trainer": {"ray": {"enabled": True, "workers": 3, "gpusPerWorker": 2}}})
    assert ("Deployment", "ragr1-trainer") not in objects
    job = objects[("RayJob", "ragr1-trainer")]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["ragr1", "train", "ppo"] and argv[-2:] == ["--num-workers", "6"]
    assert arg(argv, "--model") == "" and arg(argv, "--output-dir") == "/checkpoints"
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 3
    assert gpus(workers["template"]["spec"]["containers"][0]) == (2, 2)


@pytest.mark.parametrize("values", [{}, {"trainer": {"ray": {"enabled": True}}}], ids=["trainer", "ray"])
def test_pods_run_as_non_root_with_read_only_root_filesystems(chart: helm_python.Chart,
                                                              values: dict[str, Any]) -> None:
    specs = list(pod_specs(render(chart, values)))
    assert len(specs) >= 7
    for name, spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])


def ingress_from(objects: Render, component: str) -> dict[int, set[str]]:
    """port -> the components (or 'prometheus', 'extra') allowed to reach it on ``component``'s pods."""
    policy = objects[("NetworkPolicy", f"ragr1-{component}-ingress")]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
    allowed: dict[int, set[str]] = {}
    for rule in policy["spec"]["ingress"]:
        peers = set()
        for peer in rule["from"]:
            labels = peer.get("podSelector", {}).get("matchLabels", {})
            if "namespaceSelector" in peer:
                peers.add("prometheus")
            elif "app.kubernetes.io/component" in labels:
                peers.add(labels["app.kubernetes.io/component"])
            else:
                peers.add("extra")
        for port in rule.get("ports", [{"port": "any"}]):
            allowed.setdefault(port["port"], set()).update(peers)
    return allowed


def test_network_policies_admit_only_the_flows_of_the_architecture(chart: helm_python.Chart) -> None:
    evaluator = {"podSelector": {"matchLabels": {"app": "eval"}}}
    objects = render(chart, {"networkPolicy": {"retrieverClients": [evaluator]}})
    deny = objects[("NetworkPolicy", "ragr1-default-deny")]
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    metrics = {"prometheus"}
    assert ingress_from(objects, "retriever-shard") == {
        ports.RETRIEVER_SHARD: {"retriever"}, ports.RETRIEVER_SHARD + ports.METRICS_OFFSET: metrics}
    assert ingress_from(objects, "retriever") == {
        ports.RETRIEVER: {"policy", "extra"}, ports.RETRIEVER_HTTP: {"policy", "extra"},
        ports.RETRIEVER + ports.METRICS_OFFSET: metrics}
    assert ingress_from(objects, "reward") == {ports.REWARD: {"policy"}, ports.REWARD + ports.METRICS_OFFSET: metrics}
    # The trainer calls no replica: the replicas read the versions it announces from Redis.
    assert ingress_from(objects, "policy") == {ports.POLICY + ports.METRICS_OFFSET: metrics}
    assert ingress_from(objects, "trainer") == {ports.TRAINER + ports.METRICS_OFFSET: metrics}
    assert ingress_from(objects, "redis") == {ports.REDIS: {"policy", "trainer"}}
    # Every pod of the release is covered by the default deny and carries the labels the rules select on.
    for (kind, name), owner in objects.items():
        if kind in ("Deployment", "StatefulSet", "Job"):
            labels = owner["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "ragr1", name
    off = render(chart, {"networkPolicy": {"enabled": False}})
    assert not [k for k in off if k[0] == "NetworkPolicy"]


def test_dashboards_configmaps_hold_the_compose_dashboards(chart: helm_python.Chart) -> None:
    objects = render(chart)
    shipped = {}
    for (kind, _), obj in objects.items():
        if kind == "ConfigMap" and obj["metadata"]["labels"].get("grafana_dashboard") == "1":
            shipped.update(obj["data"])
    on_disk = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert set(shipped) == set(on_disk)
    for name, text in shipped.items():
        assert json.loads(text) == json.loads(on_disk[name]), name


def test_credentials_come_from_secrets(chart: helm_python.Chart) -> None:
    objects = render(chart)
    token = objects[("Secret", "ragr1-auth")]
    assert len(token["data"]["token"]) > 40
    assert "redis-password" in objects[("Secret", "ragr1-redis")]["data"]
    for component in SERVERS:
        kind = "StatefulSet" if component == "retriever-shard" else "Deployment"
        c = container(objects, kind, component)
        assert env(c)["RAGR1_AUTH_TOKEN_FILE"] == env(c)["RAGR1_CLIENT_TOKEN_FILE"], component
        volumes = objects[(kind, f"ragr1-{component}")]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "auth", "secret": {"secretName": "ragr1-auth"}} in volumes, component
    policy_env = env(container(objects, "Deployment", "policy"))
    assert policy_env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "ragr1-redis", "key": "redis-password"}}
    assert policy_env["RAGR1_REDIS_URL"] == f"redis://:$(REDIS_PASSWORD)@ragr1-redis:{ports.REDIS}/0"
    # A user's own Secret replaces the generated one.
    own = render(chart, {"auth": {"existingSecret": "mine"}})
    assert ("Secret", "ragr1-auth") not in own
    volumes = own[("Deployment", "ragr1-reward")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "auth", "secret": {"secretName": "mine"}} in volumes


def test_tls_turns_probes_into_the_ragr1_probe_with_the_ca(chart: helm_python.Chart) -> None:
    objects = render(chart, EVERYTHING_ON)
    reward = container(objects, "Deployment", "reward")
    probe = ["python", "-m", "ragr1.services.common.healthcheck", f"localhost:{ports.REWARD}",
             "--ca-file", "/var/run/secrets/ragr1/tls/ca.crt"]
    assert reward["readinessProbe"]["exec"]["command"] == probe
    assert reward["livenessProbe"]["exec"]["command"] == [*probe, "--service", LIVENESS]
    variables = env(reward)
    assert variables["RAGR1_TLS_CERT_FILE"].endswith("tls.crt")
    assert variables["RAGR1_TLS_CLIENT_CA_FILE"] == variables["RAGR1_CLIENT_CA_FILE"]


def test_external_redis_replaces_the_in_chart_one(chart: helm_python.Chart) -> None:
    objects = render(chart, {"redis": {"enabled": False, "url": "redis://redis.example:6379/0"}})
    assert ("StatefulSet", "ragr1-redis") not in objects
    assert env(container(objects, "Deployment", "trainer"))["RAGR1_REDIS_URL"] == "redis://redis.example:6379/0"
    with pytest.raises(helm_python.HelmError, match=r"redis\.url is required"):
        render(chart, {"redis": {"enabled": False}})


AUTH_TLS_SHARDS_RAY = {
    "auth": {"enabled": True},
    "tls": {"enabled": True, "secretName": "ragr1-tls", "mutual": True},
    "retriever": {"shards": 4},
    "trainer": {"ray": {"enabled": True, "workers": 2}},
}
# Pods whose process calls another service: the router (shards), the policy (router, reward) and the
# trainer, here the Ray head that runs `ragr1 train ppo` (it calls no replica now, but keeps the client files).
CALLERS = ("ragr1-retriever", "ragr1-policy", "ragr1-trainer-head")
CLIENT_FILES = ("RAGR1_CLIENT_TOKEN_FILE", "RAGR1_CLIENT_CA_FILE", "RAGR1_CLIENT_CERT_FILE", "RAGR1_CLIENT_KEY_FILE")


def test_auth_tls_shards_and_ray_mount_the_token_and_certificates_wherever_a_call_is_made(
    chart: helm_python.Chart,
) -> None:
    """Every file a ragr1 process is told to read (RAGR1_*_FILE) lies on a volume mounted from the
    Secret that holds it, and every pod that calls another service has the token and the client TLS
    files: a missing mount would make that pod fail, or its calls be refused, only on the cluster."""
    objects = render(chart, AUTH_TLS_SHARDS_RAY)
    secrets = {"ragr1-auth": {"token"}, "ragr1-tls": {"ca.crt", "tls.crt", "tls.key"}}
    seen = set()
    for name, spec in pod_specs(objects):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            variables = env(c)
            for var, path in variables.items():
                if not (var.startswith("RAGR1_") and var.endswith("_FILE")):
                    continue
                mounts = [m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"] + "/")]
                assert len(mounts) == 1, (name, var, path)
                secret = volumes[mounts[0]["name"]]["secret"]["secretName"]
                assert path.rsplit("/", 1)[1] in secrets[secret], (name, var, path, secret)
            if name in CALLERS and c is spec["containers"][0]:
                assert set(CLIENT_FILES) <= set(variables), (name, sorted(variables))
                seen.add(name)
    assert seen == set(CALLERS)
    assert ("Deployment", "ragr1-trainer") not in objects  # the trainer is the Ray head here
    router = container(objects, "Deployment", "retriever")
    assert len(arg(router["args"], "--shards").split(",")) == 4
    # Every server requires the token and serves TLS to clients that show a certificate (mTLS).
    for component in SERVERS:
        kind = "StatefulSet" if component == "retriever-shard" else "Deployment"
        if component == "trainer":
            variables = env(objects[("RayJob", "ragr1-trainer")]["spec"]["rayClusterSpec"]["headGroupSpec"]
                            ["template"]["spec"]["containers"][0])
        else:
            variables = env(container(objects, kind, component))
        for var in ("RAGR1_AUTH_TOKEN_FILE", "RAGR1_TLS_CERT_FILE", "RAGR1_TLS_KEY_FILE", "RAGR1_TLS_CLIENT_CA_FILE"):
            assert var in variables, (component, var)


def test_values_schema_refuses_wrong_types_and_unknown_keys(chart: helm_python.Chart) -> None:
    for values, message in [
        ({"retriever": {"shards": "4"}}, "at '/retriever/shards': got string, want integer"),
        ({"retriever": {"shard": {"gpus": -1}}}, "at '/retriever/shard/gpus': minimum"),
        ({"retriever": {"shardz": 4}}, "additional properties 'shardz' not allowed"),
        ({"index": {"type": "ivf"}}, "at '/index/type': value must be one of"),
        ({"auth": {"enabled": "yes"}}, "at '/auth/enabled': got string, want boolean"),
        ({"tls": {"enabled": True, "secretname": "x"}}, "additional properties 'secretname' not allowed"),
        ({"trainer": {"ray": {"worker": 4}}}, "additional properties 'worker' not allowed"),
        ({"policy": {"gpuMemoryUtilization": 1.5}}, "at '/policy/gpuMemoryUtilization': maximum"),
        ({"redis": {"enabled": False, "url": "redis.example:6379"}}, "does not match pattern"),
        ({"ports": {"policy": "50052"}}, "at '/ports/policy': got string, want integer"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"image": {"reward": {"repo": "x"}}}, "additional properties 'repo' not allowed"),
        ({"retriever": {"router": {"imageRole": "policy"}}}, "at '/retriever/router/imageRole': value must be one of"),
        ({"trainer": {"alarms": {"entropyFloor": -0.1}}}, "at '/trainer/alarms/entropyFloor': minimum"),
        ({"trainer": {"alarms": {"logprobGapThreshold": 0}}}, "at '/trainer/alarms/logprobGapThreshold'"),
        ({"trainer": {"alarms": {"klceiling": 1}}}, "additional properties 'klceiling' not allowed"),
        ({"policy": {"autoscaling": {"enabled": "yes"}}}, "at '/policy/autoscaling/enabled': got string, want boolean"),
        ({"policy": {"autoscaling": {"maxReplicas": 0}}}, "at '/policy/autoscaling/maxReplicas': minimum"),
        ({"policy": {"autoscaling": {"promptsPerReplica": -1}}}, "at '/policy/autoscaling/promptsPerReplica': minimum"),
        ({"policy": {"autoscaling": {"kedaVersion": "latest"}}}, "at '/policy/autoscaling/kedaVersion': 'latest'"),
        ({"trainer": {"samplesPerPrompt": 0}}, "at '/trainer/samplesPerPrompt': minimum"),
        ({"policy": {"maxNumSeqs": 0}}, "at '/policy/maxNumSeqs': minimum"),
        ({"policy": {"maxInFlight": -1}}, "at '/policy/maxInFlight': minimum"),
        ({"policy": {"maxInFlight": "auto"}}, "at '/policy/maxInFlight': got string, want integer"),
        ({"policy": {"autoscaling": {"max": 4}}}, "additional properties 'max' not allowed"),
        ({"networkPolicy": {"prometheus": {"pods": {}}}}, "additional properties 'pods' not allowed"),
    ]:
        with pytest.raises(helm_python.HelmError, match=re.escape(message)):
            render(chart, values)
    render(chart, yaml.safe_load((CHART / "values-cpu.yaml").read_text()))  # the shipped values pass


def test_each_component_runs_its_roles_image_from_the_registry_with_its_tag(chart: helm_python.Chart) -> None:
    objects = render(chart, {"image": {"registry": "registry.example/rl/", "tag": "v1",
                                       "reward": {"repository": "ragr1-reward", "tag": "v1-slim"}}})
    images = {name: container(objects, kind, name)["image"] for kind, name in [
        ("Deployment", "reward"), ("Deployment", "retriever"), ("StatefulSet", "retriever-shard"),
        ("Deployment", "policy"), ("Deployment", "trainer")]}
    assert images == {
        "reward": "registry.example/rl/ragr1-reward:v1-slim",
        "retriever": "registry.example/rl/ragr1-retriever:v1",
        "retriever-shard": "registry.example/rl/ragr1-retriever:v1",
        "policy": "registry.example/rl/ragr1-policy:v1",
        "trainer": "registry.example/rl/ragr1-trainer:v1",
    }
    assert index_job(objects)["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/rl/ragr1-index:v1")
    defaults = render(chart)
    assert container(defaults, "Deployment", "reward")["image"] == "ragr1-reward:gpu"
