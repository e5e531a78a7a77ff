"""The policy as a Deployment any number of replicas may join, and the optional KEDA autoscaler that
sizes it by the prompts waiting on the prompts stream (a ScaledObject on the rollout workers' consumer
group, with a TriggerAuthentication for Redis's password and TLS)."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import redis

from ragr1.services.common import ports
from ragr1.services.common.streams import PROMPTS
from ragr1.services.policy.config import PolicyConfig
from tests.deploy.charts import NAMESPACE, Render, env, render

ON = {"policy": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6, "backlogPerReplica": 24}}}


def on(**values: Any) -> dict[str, Any]:
    return {**ON, **values}


def kinds(objects: Render, *wanted: str) -> list[tuple[str, str]]:
    return [key for key in objects if key[0] in wanted]


def trigger(objects: Render) -> dict[str, Any]:
    (scaler,) = [obj for (kind, _), obj in objects.items() if kind == "ScaledObject"]
    (only,) = scaler["spec"]["triggers"]
    return dict(only)


def secret_refs(objects: Render) -> dict[str, tuple[str, str]]:
    """parameter -> (Secret, key) of the TriggerAuthentication the trigger names."""
    auth = objects[("TriggerAuthentication", trigger(objects)["authenticationRef"]["name"])]
    return {ref["parameter"]: (ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]}


def test_policy_is_a_deployment_that_keeps_what_the_replicas_need(chart: helm_python.Chart) -> None:
    objects = render(chart)
    assert ("StatefulSet", "ragr1-policy") not in objects
    policy = objects[("Deployment", "ragr1-policy")]
    assert policy["spec"]["replicas"] == 2
    # No surge: an extra GPU pod during an upgrade may find no GPU free.
    assert policy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    pod = policy["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    (checkpoints,) = [v for v in pod["volumes"] if v["name"] == "checkpoints"]
    claim = objects[("PersistentVolumeClaim", checkpoints["persistentVolumeClaim"]["claimName"])]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    c = pod["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in c["volumeMounts"]
    assert env(c)["RAGR1_WORKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Headless, so the ServiceMonitor gets each replica's own address; it selects the Deployment's pods.
    service = objects[("Service", "ragr1-policy")]
    assert service["spec"]["clusterIP"] == "None"
    labels = policy["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert policy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert render(chart, {"policy": {"replicas": 5}})[("Deployment", "ragr1-policy")]["spec"]["replicas"] == 5


def test_no_autoscaler_by_default(chart: helm_python.Chart) -> None:
    objects = render(chart)
    assert kinds(objects, "ScaledObject", "TriggerAuthentication") == []
    assert ("Secret", "ragr1-redis-scaler") not in objects


def test_keda_sizes_the_policy_deployment_by_the_rollout_workers_backlog(chart: helm_python.Chart) -> None:
    objects = render(chart, ON)
    policy = objects[("Deployment", "ragr1-policy")]
    assert "replicas" not in policy["spec"]  # KEDA owns the number; a fixed one would fight it on upgrades
    (scaler,) = [obj for (kind, _), obj in objects.items() if kind == "ScaledObject"]
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": policy["apiVersion"], "kind": "Deployment", "name": policy["metadata"]["name"]}
    assert (scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"]) == (2, 6)
    t = trigger(objects)
    assert t["type"] == "redis-streams"
    meta = t["metadata"]
    assert (meta["stream"], meta["consumerGroup"]) == (PROMPTS, PolicyConfig().worker_group)
    assert (meta["lagCount"], meta["activationLagCount"]) == ("24", "0")
    # The in-chart Redis by its namespaced name (KEDA's operator runs in another namespace).
    redis_service = objects[("Service", "ragr1-redis")]
    assert meta["address"] == f"{redis_service['metadata']['name']}.{NAMESPACE}.svc:{ports.REDIS}"
    assert {p["port"] for p in redis_service["spec"]["ports"]} == {ports.REDIS}
    assert meta["databaseIndex"] == "0" and "enableTLS" not in meta
    # The password is the one the in-chart Redis requires: the same Secret and key.
    server = objects[("StatefulSet", "ragr1-redis")]["spec"]["template"]["spec"]["containers"][0]
    required = env(server)["REDIS_PASSWORD"]["secretKeyRef"]
    assert secret_refs(objects) == {"password": (required["name"], required["key"])}
    own = render(chart, on(redis={"existingSecret": "mine"}))
    assert secret_refs(own) == {"password": ("mine", "redis-password")}


def test_keda_trusts_the_charts_ca_and_shows_the_client_certificate(chart: helm_python.Chart) -> None:
    objects = render(chart, on(tls={"enabled": True, "secretName": "ragr1-tls", "mutual": True}))
    refs = secret_refs(objects)
    # KEDA takes `tls: enable` from a Secret only, and refuses it beside enableTLS in the trigger.
    assert "enableTLS" not in trigger(objects)["metadata"]
    switch = objects[("Secret", refs.pop("tls")[0])]
    assert switch["stringData"] == {"tls": "enable"}
    assert refs == {"password": ("ragr1-redis", "redis-password"), "ca": ("ragr1-tls", "ca.crt"),
                    "cert": ("ragr1-tls", "tls.crt"), "key": ("ragr1-tls", "tls.key")}
    one_way = secret_refs(render(chart, on(tls={"enabled": True, "secretName": "ragr1-tls"})))
    assert set(one_way) == {"password", "tls", "ca"}


@pytest.mark.parametrize("password", ["secret", "p%40ss%3Aw0rd%25"], ids=["plain", "escaped"])
def test_an_external_redis_is_read_where_and_as_the_workers_read_it(chart: helm_python.Chart,
                                                                     password: str) -> None:
    url = f"rediss://:{password}@redis.example:6380/2"
    objects = render(chart, on(redis={"enabled": False, "url": url}))
    meta = trigger(objects)["metadata"]
    workers = redis.ConnectionPool.from_url(url).connection_kwargs  # as redis-py reads the URL
    assert meta["address"] == f"{workers['host']}:{workers['port']}"
    assert meta["databaseIndex"] == str(workers["db"])
    refs = secret_refs(objects)
    assert set(refs) == {"password", "tls"}  # rediss:// with a public CA: no CA of the chart's
    name, key = refs["password"]
    assert objects[("Secret", name)]["stringData"][key] == workers["password"]
    plain = render(chart, on(redis={"enabled": False, "url": "redis://redis.example/0"}))
    assert trigger(plain)["metadata"]["address"] == f"redis.example:{ports.REDIS}"
    assert "authenticationRef" not in trigger(plain)
    assert kinds(plain, "TriggerAuthentication") == [] and ("Secret", "ragr1-redis-scaler") not in plain


def test_keda_may_reach_the_in_chart_redis(chart: helm_python.Chart) -> None:
    def peers(objects: Render) -> list[dict[str, Any]]:
        (rule,) = objects[("NetworkPolicy", "ragr1-redis-ingress")]["spec"]["ingress"]
        return list(rule["from"])

    keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}}}
    assert keda not in peers(render(chart))
    assert keda in peers(render(chart, ON))


def test_min_replicas_above_max_is_refused(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match=r"policy\.autoscaling\.minReplicas \(7\) must not be above "
                                                    r"policy\.autoscaling\.maxReplicas \(6\)"):
        render(chart, {"policy": {"autoscaling": {"enabled": True, "minReplicas": 7, "maxReplicas": 6}}})
    render(chart, {"policy": {"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1}}})
