"""No deployment's default keeps a policy replica's engine below its batch: each runs its rollout worker with
``max_in_flight`` 0 (as many trajectories as the engine runs at once) or a cap of at least ``max_num_seqs``, and
KEDA's target gives a replica the prompts that bring that many trajectories (the trainer's samples per prompt
each). The settings are resolved as the policy resolves its
own (``PolicyConfig`` from flags and RAGR1_* variables) from the rendered chart, the compose files (CPU and the
GPU overlay) and the service specs `ragr1 up` starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from ragr1.services.policy.config import PolicyConfig
from ragr1.services.policy.streaming import resolve_max_in_flight
from ragr1.services.trainer.config import PPOConfig
from ragr1.stack import wiring
from ragr1.stack.config import UpConfig
from ragr1.stack.scale import replica_name
from tests.deploy.charts import container, env, render
from tests.deploy.compose import config as compose_config
from tests.deploy.conftest import CHART
from tests.deploy.test_chart_matches_compose import chart_argv, flags, settings

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"


def running(config: PolicyConfig, engine_batch: int) -> int:
    """Trajectories the replica's worker keeps going beside an engine that runs ``engine_batch`` at once."""
    return resolve_max_in_flight(config.max_in_flight, engine_batch)


def below_its_batch(config: PolicyConfig) -> list[int]:
    """The engine batches (every one the KV cache may leave, up to max_num_seqs) the worker would leave
    part-empty."""
    return [b for b in range(1, config.max_num_seqs + 1) if running(config, b) < b]


def chart_policy(values: dict[str, Any]) -> tuple[PolicyConfig, dict[str, Any]]:
    loaded = helm_python.Chart.load(CHART)
    try:
        objects = render(loaded, values)
    finally:
        loaded.close()
    c = container(objects, "Deployment", "policy")
    return settings(PolicyConfig, flags(chart_argv(c)), env(c)), objects


def trainer_samples(objects: dict[Any, Any]) -> int:
    """The trainer's samples per prompt, as it parses its rendered command line."""
    trainer = container(objects, "Deployment", "trainer")
    return int(settings(PPOConfig, flags(chart_argv(trainer)), env(trainer)).samples_per_prompt)


def values_file(name: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / name).read_text()) if name else {}


@pytest.mark.parametrize("samples", [None, 4])
@pytest.mark.parametrize("values", ["", "values-cpu.yaml", "values-wikipedia.yaml"])
def test_the_chart_keeps_every_engine_full_and_keda_gives_each_replica_a_batch_of_work(
    values: str, samples: int | None
) -> None:
    chosen = values_file(values)
    config, _ = chart_policy(chosen)
    assert config.max_in_flight == 0 and not below_its_batch(config), (config.max_in_flight, config.max_num_seqs)

    autoscaled = {**chosen, "policy": {**chosen.get("policy", {}), "autoscaling": {
        **chosen.get("policy", {}).get("autoscaling", {}), "enabled": True, "prometheusAddress": PROMETHEUS,
        "kedaVersion": "2.17.0"}}}
    if samples is not None:
        autoscaled["trainer"] = {**chosen.get("trainer", {}), "samplesPerPrompt": samples}
    config, objects = chart_policy(autoscaled)
    (scaler,) = [obj for (kind, _), obj in objects.items() if kind == "ScaledObject"]
    (prompts,) = [t for t in scaler["spec"]["triggers"] if t["name"] == "prompts"]
    # The target is in prompts, as the trainer's backlog counts them, and each brings the trainer's samples per
    # prompt (its group, run on one replica): the most prompts whose trajectories fit the largest batch the worker
    # runs, one at least. Fewer would start replicas whose engines stay part-empty; more (the trajectories
    # themselves) left a fleet samples-per-prompt times too small while prompts waited.
    per_prompt = trainer_samples(objects)
    assert per_prompt == (samples or 1)
    batch = running(config, config.max_num_seqs)
    assert int(prompts["metadata"]["threshold"]) == max(1, batch // per_prompt), (batch, per_prompt)


def test_a_cap_below_the_batch_is_what_the_check_finds() -> None:
    """The check above can fail: a chart that capped the worker at the old constant would be caught."""
    config, _ = chart_policy({"policy": {"maxInFlight": 8}})
    assert (config.max_in_flight, config.max_num_seqs) == (8, 64)
    assert below_its_batch(config) == list(range(9, 65))
    config, _ = chart_policy({"policy": {"maxInFlight": 80}})
    assert not below_its_batch(config)


@pytest.mark.parametrize("files", [("docker-compose.yml",), ("docker-compose.yml", "docker-compose.gpu.yml")])
def test_compose_keeps_the_engine_full_on_the_cpu_and_on_a_gpu(files: tuple[str, ...]) -> None:
    policy = compose_config(*files)["services"]["policy"]
    config = settings(PolicyConfig, flags(policy["command"]), policy["environment"])
    # Stated on the command line, not left to a default that could change under it.
    assert "--max-in-flight" in policy["command"] and "--max-num-seqs" in policy["command"]
    assert not below_its_batch(config), (config.max_in_flight, config.max_num_seqs)


def test_ragr1_up_keeps_every_replicas_engine_full() -> None:
    up = UpConfig()
    ports = wiring.Ports.of(up)
    for i in range(2):
        spec = wiring.policy_spec(up, ports, Path("/models/m"), name=replica_name(i), port=ports.replica(i))
        config = settings(PolicyConfig, spec.args[2:], {})
        assert config.max_in_flight == up.max_in_flight == 0 and config.max_num_seqs == up.max_num_seqs
        assert not below_its_batch(config)
    explicit = UpConfig(max_in_flight=300, max_num_seqs=256)
    spec = wiring.policy_spec(explicit, ports, Path("/models/m"))
    config = settings(PolicyConfig, spec.args[2:], {})
    assert (config.max_in_flight, config.max_num_seqs) == (300, 256)
