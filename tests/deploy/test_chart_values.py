"""Every value of the Helm chart that becomes a setting of a ``ragr1`` command is named after the config
field it sets: ``trainer.alarms.klCeiling`` is ``--kl-ceiling`` (``kl_ceiling``), ``policy.maxModelLen`` is
``--max-model-len``, ``index.type`` is ``--index-type`` (its section carries the field's prefix).

How: every value the schema declares is changed on its own (a number moved, a bool flipped, another enum
member, a string or list changed, within the schema) and the chart rendered again; every ``ragr1`` command
line of the two renders is parsed by the real CLI into its config's fields (fixed settings included, e.g.
``serve rollout-worker``'s ``worker``), and its ``RAGR1_*`` variables are read as fields the way ``load``
reads them. What differs between the two renders is what that value sets. Values that set nothing
(resources, images, storage) are fine; a value that sets a field under another name must be listed below
with its reason. Flags and variables that are no field of their command fail, and so do the same in
docker-compose (where ``load`` would ignore an unknown ``RAGR1_*`` variable without a word).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import io
import json
import re
import shlex
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from ragr1.cli import build_parser
from ragr1.services.common.config import ENV_PREFIX, settings_of
from tests.deploy.charts import EVERYTHING_ON, NAMESPACE
from tests.deploy.compose import config as compose_config
from tests.deploy.conftest import CHART, ragr1_invocations

Leaf = tuple[str, ...]

# The values every leaf is changed on: the defaults (plus the values that do nothing while their switch
# is off, so that turning tls, the external Redis or the autoscaler on renders) and everything optional
# turned on (TLS and mTLS, the RayJob trainer, an external Redis, the models volume, a corpus), where the
# values behind those switches take effect.
BASES: dict[str, dict[str, Any]] = {
    "defaults": {"tls": {"secretName": "ragr1-tls"}, "redis": {"url": "redis://redis.example:6379/0"},
                 "policy": {"autoscaling": {"prometheusAddress": "http://prometheus:9090", "kedaVersion": "2.17.0"}}},
    "everything": {
        **copy.deepcopy(EVERYTHING_ON),
        "trainer": {"ray": {"enabled": True}},
        "redis": {"enabled": False, "url": "rediss://:secret@redis.example:6379/0"},
        "index": {"corpus": {"input": ["/models/corpus.jsonl.gz"]}},
        "policy": {"autoscaling": {"prometheusAddress": "http://prometheus:9090", "kedaVersion": "2.17.0"}},
    },
}

# Values that set a field under another name, deliberately: the fields each sets that way, and why.
PORTS = "the table of ragr1/services/common/ports.py: its service's `port`, and part of its clients' addresses"
SWITCH = "a switch: it points these file settings at the chart's own mounted Secret (or takes them away)"
EXCEPTIONS: dict[str, tuple[frozenset[str], str]] = {
    "ports.retriever": (frozenset({"port", "retriever_address"}), PORTS),
    "ports.reward": (frozenset({"port", "reward_address"}), PORTS),
    "ports.policy": (frozenset({"port"}), PORTS),
    "ports.trainer": (frozenset({"port"}), PORTS),
    "ports.retrieverShard": (frozenset({"port", "shards"}), PORTS),
    "ports.retrieverHttp": (frozenset({"http_port"}), PORTS),
    "auth.enabled": (frozenset({"auth_token_file", "client_token_file"}), SWITCH),
    "tls.enabled": (
        frozenset({"tls_cert_file", "tls_key_file", "tls_client_ca_file", "client_ca_file", "client_cert_file",
                   "client_key_file", "redis_ca_file", "redis_cert_file", "redis_key_file", "redis_url"}),
        SWITCH + "; the in-chart Redis's URL becomes rediss://",
    ),
    "tls.mutual": (
        frozenset({"tls_client_ca_file", "client_cert_file", "client_key_file", "redis_cert_file",
                   "redis_key_file"}),
        SWITCH,
    ),
    "redis.enabled": (
        frozenset({"redis_url"}),
        "a switch between the in-chart Redis (whose URL the chart makes) and redis.url",
    ),
    "retriever.shards": (
        frozenset({"num_shards"}),
        "one count for the index build's num_shards, the shard StatefulSet's replicas and the router's shards",
    ),
    "retriever.router.http": (
        frozenset({"http_port"}),
        "a switch: http_port is ports.retrieverHttp, or -1 (off); the Service and NetworkPolicy follow it",
    ),
    "policy.gpus": (
        frozenset({"tensor_parallel_size"}),
        "the pod's nvidia.com/gpu request; vLLM splits the model over all of them (at least 1)",
    ),
    "trainer.ray.workers": (
        frozenset({"num_workers"}),
        "Ray worker pods; num_workers (one Ray Train worker per GPU) is workers x gpusPerWorker",
    ),
    "trainer.ray.gpusPerWorker": (
        frozenset({"num_workers"}),
        "each Ray worker pod's GPUs; num_workers (one Ray Train worker per GPU) is workers x gpusPerWorker",
    ),
}

# extraArgs: the command's own flags, appended as written. Each is changed by a flag of its command and
# must set that field and nothing else.
EXTRA_ARGS: dict[str, tuple[list[str], str]] = {
    "index.build.extraArgs": (["--nlist", "77"], "nlist"),
    "retriever.shard.extraArgs": (["--log-level", "DEBUG"], "log_level"),
    "retriever.router.extraArgs": (["--log-level", "DEBUG"], "log_level"),
    "policy.extraArgs": (["--log-level", "DEBUG"], "log_level"),
    "reward.extraArgs": (["--log-level", "DEBUG"], "log_level"),
    "trainer.extraArgs": (["--log-level", "DEBUG"], "log_level"),
}

# RAGR1_* variables that no command's config has: the whole process reads them, whatever the command.
CLIENTS = "ragr1/services/common/client.py: ChannelOptions of every client the process opens"
PROCESS_ENV = {
    "RAGR1_CACHE_DIR": "ragr1/shipped.py: where every command caches derived files (models, embeddings)",
    "RAGR1_DATA_DIR": "ragr1/shipped.py: where the shipped data is",
    "RAGR1_CLIENT_CA_FILE": CLIENTS,
    "RAGR1_CLIENT_CERT_FILE": CLIENTS,
    "RAGR1_CLIENT_KEY_FILE": CLIENTS,
    "RAGR1_CLIENT_TOKEN_FILE": CLIENTS,
}
PROCESS = "(the process)"
# docker-compose variables that are no field of the commands of the services they are given to.
SHARED = "x-ragr1's environment, which every ragr1 service shares (ingest and build are no servers)"
COMPOSE_ENV = {
    ("index-build", "RAGR1_INDEX_PASSAGES"): "`ragr1 up`'s index_passages; the script passes it as --limit",
    ("index-build", "RAGR1_HOST"): SHARED,
    ("index-build", "RAGR1_DRAIN_SECONDS"): SHARED,
    ("index-build", "RAGR1_LOG_LEVEL"): SHARED,
}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def names_for(leaf: Leaf) -> set[str]:
    """The field names a value may set: its key, or its key after its section's name."""
    names = {snake(leaf[-1])}
    if len(leaf) > 1:
        names.add(f"{snake(leaf[-2])}_{snake(leaf[-1])}")
    return names


# ---- the schema's values and a changed value for each --------------------------------------------------


def schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**resolve(target, root), **{k: v for k, v in node.items() if k != "$ref"}}


def leaves(node: dict[str, Any], root: dict[str, Any], path: Leaf = ()) -> Iterator[tuple[Leaf, dict[str, Any]]]:
    """Every value the schema declares that has no values of its own, with its (resolved) schema."""
    for key, child in node.get("properties", {}).items():
        resolved = resolve(child, root)
        if "properties" in resolved:
            yield from leaves(resolved, root, (*path, key))
        else:
            yield (*path, key), resolved


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def lookup(values: dict[str, Any], leaf: Leaf) -> Any:
    node: Any = values
    for key in leaf:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def nested(leaf: Leaf, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {leaf[-1]: value}
    for key in reversed(leaf[:-1]):
        out = {key: out}
    return out


QUANTITIES = ["3Gi", "5Gi"]
URLS = ["rediss://:other@redis.other:6380/1", "redis://redis.other:6380/1"]
VERSIONS = ["2.18.0", "2.19.1"]


def changed(leaf: Leaf, node: dict[str, Any], current: Any, root: dict[str, Any]) -> Any:
    """Another value than ``current`` that the schema accepts."""
    if ".".join(leaf) in EXTRA_ARGS:
        return [*(current or []), *EXTRA_ARGS[".".join(leaf)][0]]
    kinds = node.get("type", [])
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "enum" in node:
        return next(v for v in node["enum"] if v != current)
    if "boolean" in kinds:
        return not current
    if "pattern" in node:
        pattern = re.compile(node["pattern"])
        return next(v for v in QUANTITIES + URLS + VERSIONS if v != current and pattern.search(v))
    if "integer" in kinds:
        bigger = (current or 0) + 1
        return bigger if bigger <= node.get("maximum", bigger) else current - 1
    if "number" in kinds:
        return current / 2 if current else 1
    if "string" in kinds:
        return f"{current}-other" if current else "other"
    if "array" in kinds:
        items = resolve(node.get("items", {}), root)
        if "enum" in items:
            return [next(v for v in items["enum"] if v not in (current or []))]
        return [*(current or []), {"name": "other"} if items.get("type") == "object" else "/other"]
    if "object" in kinds:
        return {**(current or {}), "other": "1"}
    raise AssertionError(f"{'.'.join(leaf)}: no way to change a value of schema {node}")


# ---- the settings each ragr1 command of a render runs with ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Command:
    name: str  # "ragr1 serve reward"
    config: type
    flags: dict[str, Any]  # field -> value, from its command line and the command's fixed settings
    wrong: tuple[str, ...]  # what on its command line is no field


@dataclasses.dataclass(frozen=True)
class Site:
    """A container (or a RayJob's entrypoint on one of its pod groups): its ragr1 commands, its RAGR1_*
    environment."""

    commands: tuple[Command, ...]
    env: dict[str, Any]


@functools.cache
def parser() -> argparse.ArgumentParser:
    return build_parser()


def fields(cls: type) -> set[str]:
    """Every setting of ``cls``, a section's by its dotted name (``format_weights.tags``)."""
    return {name for name, _, _ in settings_of(cls)}


def env_field(name: str) -> str:
    """The setting a ``RAGR1_*`` variable sets (``RAGR1_FORMAT_WEIGHTS__TAGS``: ``format_weights.tags``)."""
    return name.removeprefix(ENV_PREFIX).lower().replace("__", ".")


@functools.cache
def command(argv: tuple[str, ...]) -> Command:
    """What ``ragr1 <argv>`` runs with, as the real CLI parses it."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args, unknown = parser().parse_known_args(list(argv))
        except SystemExit:
            raise AssertionError(f"ragr1 {shlex.join(argv)}: {stderr.getvalue().strip()}") from None
    cls = args.config_class
    flags = {name: getattr(args, name) for name in fields(cls) if getattr(args, name) is not None}
    flags.update(args.fixed_settings)
    wrong = tuple(unknown) + (("--config",) if args.config is not None else ())
    return Command(args.command_name, cls, flags, wrong)


def commands(argv: list[str]) -> tuple[Command, ...]:
    return tuple(command(tuple(a)) for a in ragr1_invocations(argv))


def ragr1_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])
            if e["name"].startswith(ENV_PREFIX)}


WORKLOADS = re.compile(r"^kind: (Deployment|StatefulSet|Job|RayJob)$", re.MULTILINE)


@functools.cache
def file_sites(text: str) -> tuple[tuple[str, Site], ...]:
    """Where -> what runs there, for one rendered template (the same text parses once). Where is the
    object's kind and component (the index Job's name changes with its settings), and the container."""
    out = []
    for doc in text.split("\n---\n"):
        if not WORKLOADS.search(doc):
            continue
        obj = yaml.load(doc, Loader=yaml.CSafeLoader)
        where = f"{obj['kind']}/{obj['metadata']['labels']['app.kubernetes.io/component']}"
        if obj["kind"] == "RayJob":  # the head runs the entrypoint; the workers run its Ray Train workers
            cluster = obj["spec"]["rayClusterSpec"]
            entrypoint = commands(shlex.split(obj["spec"]["entrypoint"]))
            for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
                for c in group["template"]["spec"]["containers"]:
                    out.append((f"{where}/{c['name']}", Site(entrypoint, ragr1_env(c))))
        else:
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if ran := commands(c.get("command", ["ragr1"]) + c.get("args", [])):
                    out.append((f"{where}/{c['name']}", Site(ran, ragr1_env(c))))
    return tuple(out)


def sites(texts: dict[str, str]) -> dict[str, Site]:
    """Where -> what runs there, for every rendered manifest."""
    found = [item for path, text in texts.items() if path.endswith(".yaml") for item in file_sites(text)]
    out = dict(found)
    assert len(out) == len(found), [where for where, _ in found]
    return out


def problems(found: dict[str, Site], allowed: Collection[tuple[str, str]] = ()) -> list[str]:
    """What is no field of its command: a flag, or a RAGR1_* variable (unless ``(where, variable)`` is
    ``allowed``)."""
    out = []
    for where, site in found.items():
        for cmd in site.commands:
            out += [f"{where}: {cmd.name}: {word} is no field of {cmd.config.__name__}" for word in cmd.wrong]
        for name in site.env:
            field = env_field(name)
            if name not in PROCESS_ENV and (where, name) not in allowed and not any(
                    field in fields(c.config) for c in site.commands):
                out.append(f"{where}: {name} is no field of {sorted({c.config.__name__ for c in site.commands})}")
    return out


def differences(before: dict[str, Site], after: dict[str, Site]) -> set[tuple[str, str]]:
    """(command, field) of every setting that differs between two renders, where the same container
    runs the same commands in both."""
    out = set()
    for where in before.keys() & after.keys():
        old, new = before[where], after[where]
        if [c.config for c in old.commands] != [c.config for c in new.commands]:
            continue
        for a, b in zip(old.commands, new.commands, strict=True):
            out |= {(b.name, f) for f in a.flags.keys() | b.flags.keys() if a.flags.get(f) != b.flags.get(f)}
        for name in old.env.keys() | new.env.keys():
            if old.env.get(name) != new.env.get(name):
                field = env_field(name)
                if name in PROCESS_ENV:
                    out.add((PROCESS, field))
                out |= {(c.name, field) for c in new.commands if field in fields(c.config)}
    return out


@dataclasses.dataclass
class Mapping:
    """What each value sets: value -> {(command, field)}, and what on the way was no field."""

    sets: dict[str, set[tuple[str, str]]]
    problems: list[str]
    renders: int


def map_values(chart_dir: Path, only: set[str] | None = None) -> Mapping:
    """Changes every value the schema declares (or ``only`` these), one at a time on every base, and
    records which settings of which commands that changes."""
    root = json.loads((chart_dir / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart_dir / "values.yaml").read_text())
    chart = helm_python.Chart.load(chart_dir)
    out = Mapping({}, [], 0)

    def run(values: dict[str, Any]) -> dict[str, Site]:
        out.renders += 1
        found = sites(chart.render(values, name="ragr1", namespace=NAMESPACE))
        out.problems.extend(p for p in problems(found) if p not in out.problems)
        return found

    try:
        for base in BASES.values():
            before = run(base)
            current = merged(defaults, base)
            for leaf, node in leaves(root, root):
                name = ".".join(leaf)
                if only is not None and name not in only:
                    continue
                value = changed(leaf, node, lookup(current, leaf), root)
                after = run(merged(base, nested(leaf, value)))
                out.sets.setdefault(name, set()).update(differences(before, after))
    finally:
        chart.close()
    return out


def misnamed(found: Mapping) -> dict[str, set[str]]:
    """Value -> the fields it sets under another name than its own (extraArgs set the flags they carry)."""
    out = {}
    for name, sets in found.sets.items():
        if name not in EXTRA_ARGS and (wrong := {f for _, f in sets} - names_for(tuple(name.split(".")))):
            out[name] = wrong
    return out


@pytest.fixture(scope="module")
def mapping() -> Mapping:
    return map_values(CHART)


def test_every_value_that_sets_a_field_is_named_after_it(mapping: Mapping) -> None:
    found = misnamed(mapping)
    declared = {name: set(fields) for name, (fields, _) in EXCEPTIONS.items()}
    unexplained = {name: (sorted(found[name]), sorted(mapping.sets[name])) for name in found.keys() - declared.keys()}
    assert not unexplained, (
        "these values set fields under other names: rename the value after the field (values.yaml, "
        f"values.schema.json, the templates, the overlays, docs), or list it in EXCEPTIONS with why: {unexplained}")
    assert found == declared, "EXCEPTIONS lists what these values no longer set (or not all they set)"


def test_the_values_map_to_the_fields_they_are_named_after(mapping: Mapping) -> None:
    """The mapping sees what the chart passes: every value was changed on every base, and the values a
    reader would look up land on their fields (through a flag, a fixed setting, or a variable)."""
    root = schema()
    assert set(mapping.sets) == {".".join(leaf) for leaf, _ in leaves(root, root)}
    assert mapping.renders == len(BASES) * (len(mapping.sets) + 1)
    expected = {
        "trainer.alarms.klCeiling": {("ragr1 train ppo", "kl_ceiling")},
        "policy.maxModelLen": {("ragr1 serve rollout-worker", "max_model_len")},
        "policy.gpuMemoryUtilization": {("ragr1 serve rollout-worker", "gpu_memory_utilization")},
        "policy.worker": {("ragr1 serve policy", "worker")},  # `serve rollout-worker` fixes worker=True
        "index.type": {("ragr1 index build", "index_type")},
        "index.corpus.input": {("ragr1 corpus ingest", "input")},
        "index.corpus.format": {("ragr1 corpus ingest", "format")},
        "redis.url": {("ragr1 serve rollout-worker", "redis_url"), ("ragr1 train ppo", "redis_url")},
    }
    assert {name: mapping.sets[name] for name in expected} == expected
    assert {(c, "drain_seconds") for c in ("ragr1 serve reward", "ragr1 train ppo")} <= mapping.sets["drainSeconds"]
    assert mapping.sets["index.size"] == mapping.sets["policy.resources.requests"] == set()


def test_extra_args_carry_the_flags_of_their_command(mapping: Mapping) -> None:
    assert set(EXTRA_ARGS) == {name for name in mapping.sets if name.endswith(".extraArgs")}
    for name, (_, field) in EXTRA_ARGS.items():
        assert {f for _, f in mapping.sets[name]} == {field}, name


def test_every_flag_and_variable_the_chart_passes_is_a_field_of_its_command(mapping: Mapping) -> None:
    """On every render above (each value changed on each base) and with each overlay the chart ships."""
    assert mapping.problems == []
    chart = helm_python.Chart.load(CHART)
    try:
        for overlay in ("values-cpu.yaml", "values-wikipedia.yaml"):
            values = yaml.safe_load((CHART / overlay).read_text())
            found = sites(chart.render(values, name="ragr1", namespace=NAMESPACE))
            assert len(found) >= 6 and problems(found) == [], overlay
    finally:
        chart.close()


def test_every_flag_and_variable_compose_passes_is_a_field_of_its_command() -> None:
    """docker-compose's flags parse (test_commands.py), but ``load`` reads only the RAGR1_* variables
    that are fields: one that is not would be ignored without a word."""
    services = compose_config("docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.auth.yml",
                              "docker-compose.tls.yml")["services"]
    found = {}
    for name, service in services.items():
        if "build" in service:  # this project's image
            ran = commands((service.get("entrypoint") or ["ragr1"]) + service.get("command", []))
            variables = {k: v for k, v in (service.get("environment") or {}).items() if k.startswith(ENV_PREFIX)}
            found[name] = Site(ran, variables)
    assert {"index-build", "retriever", "retriever-shard-0", "reward", "policy", "trainer"} <= set(found)
    assert problems(found, set(COMPOSE_ENV)) == []
    assert all(var in found[where].env for where, var in COMPOSE_ENV), "COMPOSE_ENV lists what compose no longer sets"


def test_a_renamed_value_or_field_is_caught(tmp_path: Path) -> None:
    """The checks above can fail: a copy of the chart with a value renamed away from its field
    (klCeiling -> klCap), a flag and a variable that are no field (as if the field had been renamed)."""
    spoilt = tmp_path / "ragr1"
    shutil.copytree(CHART, spoilt, symlinks=False)
    edits = {
        "values.yaml": [("klCeiling:", "klCap:")],
        "values.schema.json": [('"klCeiling"', '"klCap"')],
        "templates/_helpers.tpl": [(".klCeiling", ".klCap"), ("- --entropy-floor", "- --entropy-min"),
                                   ("RAGR1_DRAIN_SECONDS", "RAGR1_DRAIN_SECS")],
    }
    for path, replacements in edits.items():
        text = (spoilt / path).read_text()
        for old, new in replacements:
            assert old in text, (path, old)
            text = text.replace(old, new)
        (spoilt / path).write_text(text)
    found = map_values(spoilt, only={"trainer.alarms.klCap", "trainer.alarms.logprobGapThreshold"})
    assert misnamed(found) == {"trainer.alarms.klCap": {"kl_ceiling"}}
    wrong = {p.split(": ", 1)[1] for p in found.problems}
    assert wrong == {
        "ragr1 train ppo: --entropy-min is no field of PPOConfig",
        "ragr1 train ppo: 0.1 is no field of PPOConfig",
        "RAGR1_DRAIN_SECS is no field of ['PPOConfig']",
        "RAGR1_DRAIN_SECS is no field of ['PolicyConfig']",
        "RAGR1_DRAIN_SECS is no field of ['RewardConfig']",
        "RAGR1_DRAIN_SECS is no field of ['RouterConfig']",
        "RAGR1_DRAIN_SECS is no field of ['ShardConfig']",
    }
