"""The policy as a Deployment any number of replicas may join, and the optional KEDA autoscaler that sizes it
by the work on the prompts stream: a ScaledObject whose two Prometheus triggers read the backlog the trainer
exports, computing the same number as ``fleet.wanted_replicas`` (tested on real stream states in
tests/common/test_fleet.py)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import helm_python
import pytest

from ragr1.services.common import fleet
from ragr1.services.trainer import metrics
from tests.deploy.charts import NAMESPACE, Render, env, render

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
ON = {"policy": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6, "promptsPerReplica": 24,
                                 "prometheusAddress": PROMETHEUS, "kedaVersion": "2.17.0"}}}


def kinds(objects: Render, *wanted: str) -> list[tuple[str, str]]:
    return [key for key in objects if key[0] in wanted]


def scaled_object(objects: Render) -> dict[str, Any]:
    (scaler,) = [obj for (kind, _), obj in objects.items() if kind == "ScaledObject"]
    return scaler


def triggers(objects: Render) -> dict[str, dict[str, str]]:
    return {t["name"]: dict(t["metadata"]) for t in scaled_object(objects)["spec"]["triggers"]}


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
    assert kinds(render(chart), "ScaledObject", "TriggerAuthentication") == []


def test_keda_sizes_the_policy_deployment_by_the_trainers_backlog_series(chart: helm_python.Chart) -> None:
    objects = render(chart, ON)
    policy = objects[("Deployment", "ragr1-policy")]
    assert "replicas" not in policy["spec"]  # KEDA owns the number; a fixed one would fight it on upgrades
    scaler = scaled_object(objects)
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": policy["apiVersion"], "kind": "Deployment", "name": policy["metadata"]["name"]}
    assert (scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"]) == (2, 6)
    # Without the trainer's series KEDA keeps the fleet as it is instead of reading "no work" as zero.
    assert scaler["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"}
    t = triggers(objects)
    assert set(t) == {"prompts", "holders"}
    trainer = objects[("Service", "ragr1-trainer")]
    assert scraped(objects, trainer)  # the series exist: enabling autoscaling alone renders the ServiceMonitor
    for name, metric in (("prompts", metrics.PROMPTS_BACKLOG), ("holders", metrics.PROMPT_HOLDERS)):
        meta = t[name]
        assert meta["serverAddress"] == PROMETHEUS and meta["ignoreNullValues"] == "false"
        assert meta["activationThreshold"] == "0"  # one waiting prompt wakes a fleet at zero
        (series,) = re.findall(r"\b(ragr1_[a-z_]+)\{", meta["query"])
        assert series == metric._name
        # This release's trainer only, as the Prometheus operator labels what the ServiceMonitor scrapes.
        assert f'namespace="{NAMESPACE}"' in meta["query"]
        assert f'service="{trainer["metadata"]["name"]}"' in meta["query"]
    assert t["prompts"]["threshold"] == "24" and t["holders"]["threshold"] == "1"


def scraped(objects: Render, service: dict[str, Any]) -> bool:
    """Whether the release's ServiceMonitor selects ``service`` and scrapes a port it has."""
    monitors = [obj for (kind, _), obj in objects.items() if kind == "ServiceMonitor"]
    return any(m["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
               and {e["port"] for e in m["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
               for m in monitors)


def test_enabling_autoscaling_is_enough_for_the_trainers_series_to_exist_in_either_form(
    chart: helm_python.Chart,
) -> None:
    """The deployment page's command alone (autoscaling on and the Prometheus address; metrics.serviceMonitor
    left off): the ServiceMonitor and the alert rules render, and scrape the trainer whether it runs as a
    Deployment or as a RayJob, whose head runs `ragr1 train ppo` (its Ray workers serve no trainer metrics)."""
    off = render(chart)
    assert kinds(off, "ServiceMonitor", "PrometheusRule") == []  # nothing asked for, nothing rendered
    for values in (ON, {**ON, "trainer": {"ray": {"enabled": True}}}):
        objects = render(chart, values)
        assert kinds(objects, "PrometheusRule") == [("PrometheusRule", "ragr1")]  # Ragr1PromptsStranded with it
        trainer = objects[("Service", "ragr1-trainer")]
        assert scraped(objects, trainer)
        query = triggers(objects)["prompts"]["query"]
        assert f'service="{trainer["metadata"]["name"]}"' in query
        if ("RayJob", "ragr1-trainer") in objects:
            cluster = objects[("RayJob", "ragr1-trainer")]["spec"]["rayClusterSpec"]
            head = cluster["headGroupSpec"]["template"]
            (workers,) = cluster["workerGroupSpecs"]
            selector = trainer["spec"]["selector"].items()
            assert selector <= head["metadata"]["labels"].items()
            assert not selector <= workers["template"]["metadata"]["labels"].items()
            names = {p["name"] for p in head["spec"]["containers"][0]["ports"]}
        else:
            pod = objects[("Deployment", "ragr1-trainer")]["spec"]["template"]
            assert trainer["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
            names = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert {p["targetPort"] for p in trainer["spec"]["ports"]} <= names


def replicas_while_the_trainer_is_away(objects: Render, current: int) -> int:
    """What KEDA holds a fleet of ``current`` replicas at once its triggers have failed ``failureThreshold`` times
    in a row (no trainer series), by the fallback's ``behavior`` as KEDA documents it."""
    fallback = scaled_object(objects)["spec"]["fallback"]
    replicas, behavior = fallback["replicas"], fallback.get("behavior", "static")
    return {"static": replicas, "currentReplicas": current, "currentReplicasIfHigher": max(current, replicas),
            "currentReplicasIfLower": min(current, replicas)}[behavior]


def test_a_busy_fleet_keeps_its_size_while_the_trainer_is_away(chart: helm_python.Chart) -> None:
    """A trainer restart longer than the fallback's threshold: a fleet of 8 stays 8 (it used to drop to the
    fallback's count: seven hand-backs, then seven cold engine loads), and a fleet below the minimum gets it."""
    objects = render(chart, ON)
    assert all(t.get("metricType", "AverageValue") == "AverageValue"  # KEDA's fallback needs average values
               for t in scaled_object(objects)["spec"]["triggers"])
    assert replicas_while_the_trainer_is_away(objects, 8) == 8
    assert replicas_while_the_trainer_is_away(objects, 1) == 2


def desired(objects: Render, values: dict[str, float]) -> int:
    """What Kubernetes's HPA asks for from KEDA's triggers (average-value metrics): the largest, over the
    triggers, of ceil(the query's value / its threshold), within min..max; ``values`` by trigger."""
    scaler = scaled_object(objects)
    wanted = max(math.ceil(values[name] / float(meta["threshold"])) for name, meta in triggers(objects).items())
    return min(max(wanted, scaler["spec"]["minReplicaCount"]), scaler["spec"]["maxReplicaCount"])


def test_the_triggers_ask_for_what_the_fleets_rule_asks_for(chart: helm_python.Chart) -> None:
    objects = render(chart, {"policy": {"autoscaling": {**ON["policy"]["autoscaling"], "minReplicas": 0,
                                                        "maxReplicas": 100, "promptsPerReplica": 8}}})
    for waiting, in_progress, holders in itertools.product([0, 1, 7, 8, 9, 40], [0, 1, 3, 16, 24], [0, 1, 3, 5]):
        if holders > in_progress:
            continue
        got = desired(objects, {"prompts": waiting + in_progress, "holders": holders})
        assert got == fleet.wanted_replicas(waiting, in_progress, holders, 8), (waiting, in_progress, holders)
    # The states that broke the lag-only rule: lag 0 with prompts in progress on three replicas.
    assert desired(objects, {"prompts": 3, "holders": 3}) == 3
    assert desired(objects, {"prompts": 1, "holders": 0}) == 1  # one waiting prompt, a fleet at zero


def test_the_prometheus_address_is_required(chart: helm_python.Chart) -> None:
    values = {"policy": {"autoscaling": {**ON["policy"]["autoscaling"], "prometheusAddress": ""}}}
    with pytest.raises(helm_python.HelmError, match=r"policy\.autoscaling\.prometheusAddress is required"):
        render(chart, values)


def test_min_replicas_above_max_is_refused(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match=r"policy\.autoscaling\.minReplicas \(7\) must not be above "
                                                    r"policy\.autoscaling\.maxReplicas \(6\)"):
        render(chart, {"policy": {"autoscaling": {**ON["policy"]["autoscaling"], "minReplicas": 7, "maxReplicas": 6}}})
    render(chart, {"policy": {"autoscaling": {**ON["policy"]["autoscaling"], "minReplicas": 0, "maxReplicas": 1}}})


def test_kedas_target_is_the_prompts_a_replica_runs_at_once_not_its_trajectories(chart: helm_python.Chart) -> None:
    """The backlog KEDA divides counts prompts, and each prompt is a group of the trainer's samples per prompt run on
    one replica: with 8 samples a prompt and 64 sequences an engine, a replica runs 8 prompts, and a target of 64
    (its trajectories) kept the fleet 8 times too small while prompts waited. The trainer is passed the same value."""
    auto = {**ON["policy"]["autoscaling"], "promptsPerReplica": 0}
    cases = [  # (samplesPerPrompt, maxInFlight, maxNumSeqs) -> prompts per replica
        ((1, 0, 64), 64), ((8, 0, 64), 8), ((3, 0, 64), 21), ((8, 16, 64), 2), ((100, 0, 64), 1), ((64, 0, 64), 1),
    ]
    for (samples, in_flight, seqs), prompts in cases:
        objects = render(chart, {"policy": {"maxInFlight": in_flight, "maxNumSeqs": seqs, "autoscaling": auto},
                                 "trainer": {"samplesPerPrompt": samples}})
        assert triggers(objects)["prompts"]["threshold"] == str(prompts), (samples, in_flight, seqs)
        args = objects[("Deployment", "ragr1-trainer")]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--samples-per-prompt") + 1] == str(samples)
    # What KEDA asks for: 40 prompts waiting at 8 samples each on 64-sequence engines fill five replicas.
    objects = render(chart, {"policy": {"autoscaling": {**auto, "maxReplicas": 100}},
                             "trainer": {"samplesPerPrompt": 8}})
    assert desired(objects, {"prompts": 40, "holders": 0}) == 5
    # An explicit target is taken as it is.
    assert triggers(render(chart, {**ON, "trainer": {"samplesPerPrompt": 8}}))["prompts"]["threshold"] == "24"


def test_the_samples_per_prompt_are_set_once_for_the_trainer_and_the_target(chart: helm_python.Chart) -> None:
    """The flag in trainer.extraArgs would change the trainer and leave KEDA's target at another value: refused."""
    for extra in (["--samples-per-prompt", "4"], ["--samples-per-prompt=4"]):
        with pytest.raises(helm_python.HelmError, match=r"trainer\.extraArgs sets --samples-per-prompt: set "
                                                        r"trainer\.samplesPerPrompt instead"):
            render(chart, {**ON, "trainer": {"extraArgs": extra}})
    render(chart, {**ON, "trainer": {"extraArgs": ["--batch-size", "32"]}})


def test_the_chart_needs_keda_2_17_for_its_fallback_and_says_so(chart: helm_python.Chart) -> None:
    """fallback.behavior came with KEDA 2.17: an older KEDA drops it without a word, and a busy fleet would fall to
    max(1, minReplicas) replicas while the trainer restarts. The operator states the KEDA installed; an older one,
    or none, is refused with what to do; 2.17 and later render the field."""
    auto = ON["policy"]["autoscaling"]
    for older in ("2.15.0", "2.16.2", "v2.16.0", "2.16"):
        said = (rf"policy\.autoscaling\.kedaVersion is {re.escape(older)}, but the ScaledObject needs KEDA 2\.17 or "
                r"later: its fallback\.behavior")
        with pytest.raises(helm_python.HelmError, match=said):
            render(chart, {"policy": {"autoscaling": {**auto, "kedaVersion": older}}})
    with pytest.raises(helm_python.HelmError, match=r"policy\.autoscaling\.kedaVersion is required with "
                                                    r"policy\.autoscaling\.enabled"):
        render(chart, {"policy": {"autoscaling": {**auto, "kedaVersion": ""}}})
    with pytest.raises(helm_python.HelmError, match=r"/policy/autoscaling/kedaVersion"):
        render(chart, {"policy": {"autoscaling": {**auto, "kedaVersion": "latest"}}})
    for newer in ("2.17.0", "2.17", "v2.18.1", "2.17.0-rc1", "3.0.0"):
        objects = render(chart, {"policy": {"autoscaling": {**auto, "kedaVersion": newer}}})
        assert scaled_object(objects)["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher", newer
    assert kinds(render(chart, {"policy": {"autoscaling": {**auto, "enabled": False, "kedaVersion": ""}}}),
                 "ScaledObject") == []  # asked only of a chart that renders the ScaledObject
