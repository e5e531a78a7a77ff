"""Every setting of every command has one home: one field definition gives its default and its help.

A command that passes a setting on to another under the same name (``ragr1 up --max-turns`` to the policy)
takes the other's definition (``same_as``); a command that runs another takes its whole config as a section
(``ragr1 demo --ppo.actor-lr``). Two commands may have settings of the same name only where the name means a
different setting there, each listed below with why.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import inspect
from pathlib import Path
from typing import Any, cast

import pytest

from ragr1.docgen.settings import commands
from ragr1.services.common.config import flag_name, home_of, section_of, settings_of
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.policy.follower import FollowerSettings, WeightFollower
from ragr1.services.policy.loops import WORKERS, RolloutLoopSettings
from ragr1.services.policy.streaming import StreamingRolloutWorker
from ragr1.services.policy.worker import RolloutWorker, WorkerSettings
from ragr1.services.retriever.batching import Batching, MicroBatcher
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.retriever.router import Router, RouterSettings
from ragr1.services.retriever.shard import ShardSearcher, ShardSettings

# Same name, different settings: each command's own, with its own default and help.
DISTINCT = {
    "port": "each service's own gRPC port (ports.py), Redis's its own",
    "batch_size": "questions per eval call, rollouts per PPO update, sequences per SFT step",
    "device": "the router's query encoder, the trainer's networks",
    "limit": "questions per file (eval, prepare, SFT), passages ingested",
    "mode": "the policy's default search mode, the PPO prompts' mode, eval's list of modes",
    "out": "each command's own output file or folder",
    "seed": "vLLM's sampling seed, the trainer's",
    "model": "the checkpoint the policy serves (the stack and data prepare take the policy's), the trainer's start",
    "train_files": "prepare writes every shipped set by default, SFT trains on HotpotQA",
    "lora_rank": "SFT trains every weight (RAG-R1's), PPO LoRA on CPUs",
    "gradient_checkpointing": "off for SFT's short sequences, on for PPO's long rollouts",
    "max_batch_rows": "the router's encoder batches, a shard's search batches",
    "nprobe": "the IVF lists a built index searches; an import keeps the source index's own unless told",
    "max_wait_ms": "the router's encoder batching, a shard's search batching",
    "encoder_backend": "the backend an index is built with (an import: torch, as their server); the router's, empty: "
    "the index's",
    "gpu": "FAISS on GPUs to build an index, to serve a shard",
    "encoder": "the encoder an index is built with; the one `index plan` sizes (the papers'); an imported "
    "index's (required: no default can be right)",
    "nlist": "a build's inverted lists; those of the Wikipedia-sized index `index plan` sizes",
    "store": "the store an index is built from (required); the one `index plan` measures recall on (optional); "
    "an import's, instead of its corpus",
    "index_type": "one index type to build (the stack's too); the list `index plan` sizes",
    "num_shards": "shard files of a build; the stack's shard processes (two, so that searches fan out)",
    "max_passage_tokens": "the stack indexes shorter passages than the encoder's preset, to build in minutes",
    "max_query_chars": "the policy cuts its queries to this length; the router refuses longer ones",
    "run_dir": "`ragr1 scale` names the folder of a running stack; the stack's own says where to write one",
    "input": "the corpus files `corpus ingest` reads; the FAISS files `index import` splits",
    "ef_search": "a build's HNSW search beam; an import keeps the source index's unless set",
    "retriever_address": "the retriever the policy's rollouts search; the one SFT's trajectories search (a service "
    "imports no other's config)",
    "max_turns": "the policy's generation turns before its answer; the most searches an SFT trajectory makes (the "
    "demo and data prepare pass the policy's)",
    "policy_replicas": "`ragr1 scale` has no default: a forgotten flag must not scale a running stack down to 1",
}


# Dataclass fields of the package that share a setting's name but are data, not settings: no command reads
# them from a flag, and no setting's default is copied into them.
RECORDS = {
    "Action.queries": "the queries of a parsed <search>",
    "SFTTrajectory.queries": "the queries an SFT trajectory searched",
    "ChannelOptions.max_message_bytes": "a client's channel option, from the process's RAGR1_CLIENT_* variables "
    "(no command's setting), with the servers' default constant",
    "Sampling.seed": "one request's sampling seed (None: unseeded); the engine's seed is EngineSettings'",
    "Task.mode": "a task's own search mode (None: the loop's)",
    "Trajectory.mode": "the mode a trajectory ran in",
    "EncoderSettings.max_query_tokens": "an encoder preset's lengths (a build's or import's setting overrides them)",
    "EncoderSettings.max_passage_tokens": "an encoder preset's lengths (a build's setting overrides them)",
    "SourceFile.hnsw_m": "read from an imported FAISS file",
    "SourceFile.ef_search": "read from an imported FAISS file",
    "SourceFile.nlist": "read from an imported FAISS file",
    "SourceFile.nprobe": "read from an imported FAISS file",
    "Hit.shard": "the shard a search hit came from",
    "Parts.format": "a trajectory's format score",
    "Sample.temperature": "the temperature a rollout was sampled at",
    "ServiceSpec.host": "where a service of the local stack listens (the stack sets it)",
}
PACKAGE = Path(__file__).resolve().parents[2] / "ragr1"
# How a field that is a setting is defined: its own definition, another's (same_as), a section.
DEFINERS = {"setting", "same_as", "section"}


def is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


def defaults_outside_settings(names: set[str]) -> dict[str, str]:
    """``Class.field`` -> where, for every dataclass field of the package named like a setting whose default
    is written outside ``setting()``: a second home of that setting's default (the mirrors issue 42 removed),
    or a record that happens to share the name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "v1" in path.relative_to(PACKAGE).parts:  # generated protobuf stubs
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ClassDef) and is_dataclass(node)):
                continue
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value):
                    continue
                value = item.value
                defined = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in DEFINERS
                if item.target.id in names and not defined:
                    found[f"{node.name}.{item.target.id}"] = f"{path.relative_to(PACKAGE.parent)}:{item.lineno}"
    return found


def definitions() -> dict[str, set[str]]:
    """Setting name -> the classes whose field definition a command's setting of that name uses."""
    homes: dict[str, set[str]] = collections.defaultdict(set)
    seen: set[type] = set()
    for command in commands():
        todo = [command.config_class]
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            for f in dataclasses.fields(cls):
                sub = section_of(f)
                if sub is not None:
                    todo.append(sub)
                home = home_of(cls, f.name)
                homes[f.name].add(f"{home.__module__}.{home.__qualname__}")
    return homes


def test_no_config_defines_a_setting_its_base_class_defines() -> None:
    """A subclass that repeats a field gives one flag two defaults and two helps (a reader must find both)."""
    twice = {}
    for command in commands():
        cls = command.config_class
        for f in dataclasses.fields(cls):
            where = [k.__qualname__ for k in cls.__mro__ if f.name in inspect.get_annotations(k)]
            if len(where) > 1:
                twice[f"{command.name} {f.name}"] = where
    assert not twice


def test_a_setting_shared_by_commands_is_defined_once() -> None:
    homes = definitions()
    several = {name: sorted(where) for name, where in homes.items() if len(where) > 1}
    unexplained = {name: where for name, where in several.items() if name not in DISTINCT}
    assert not unexplained, "define each once and take it with same_as, or say in DISTINCT why they differ"
    # Nothing listed that no longer needs the excuse.
    assert set(DISTINCT) <= set(several), set(DISTINCT) - set(several)



def test_no_core_class_keeps_its_own_default_of_a_setting() -> None:
    """The services' core classes (the loop, the engine, sampling, limits, the reward's parts, the index spec,
    the router's limits, the restart policy) define the settings they read with ``setting()``, and the
    commands take those definitions: a default written again elsewhere is a mirror, which this finds."""
    found = defaults_outside_settings(set(definitions()))
    mirrors = {name: where for name, where in found.items() if name not in RECORDS}
    assert not mirrors, "define the setting once with setting() and take that field, or say in RECORDS why not"
    assert set(RECORDS) <= set(found), set(RECORDS) - set(found)


def test_the_services_core_classes_are_the_homes_of_their_settings() -> None:
    """Where a service config's settings are defined: the core's classes, not the config."""
    homes = definitions()
    expected = {
        "max_model_len": "ragr1.services.policy.agent.ContextSettings",
        "max_tokens_per_turn": "ragr1.services.policy.agent.SamplingSettings",
        "kv_cache_gib": "ragr1.services.policy.engine.EngineSettings",
        "max_question_chars": "ragr1.services.policy.runtime.RolloutLimits",
        "em_weight": "ragr1.services.reward.scoring.Composition",
        "max_response_chars": "ragr1.services.reward.scoring.ScoreLimits",
        "tags": "ragr1.services.reward.format_check.FormatWeights",
        "pq_m": "ragr1.services.retriever.index.IndexParams",
        "max_top_k": "ragr1.services.retriever.router.SearchLimits",
        "max_restarts": "ragr1.stack.supervisor.RestartPolicy",
        "worker_batch": "ragr1.services.policy.worker.WorkerSettings",
        "heartbeat_seconds": "ragr1.services.policy.follower.FollowerSettings",
        "rollout_loop": "ragr1.services.policy.loops.RolloutLoopSettings",
        "query_cache_size": "ragr1.services.retriever.router.RouterSettings",
        "checksum": "ragr1.services.retriever.shard.ShardSettings",
        "search_threads": "ragr1.services.retriever.shard.ShardSettings",
    }
    assert {name: homes[name] for name in expected} == {name: {home} for name, home in expected.items()}
    # The loop's turns, and SFT's searches a trajectory makes at most (DISTINCT says why two): nowhere else.
    assert homes["max_turns"] == {"ragr1.services.policy.agent.LoopConfig", "ragr1.services.trainer.config.SFTConfig"}


# The services' parts that take a settings object whole, as vLLM's take their config: the part, the class of
# that object, and the config of the service, which is the object's settings (a flag each) and makes it.
PARTS: list[tuple[type, type, type]] = [
    (RolloutWorker, WorkerSettings, PolicyConfig),
    (StreamingRolloutWorker, WorkerSettings, PolicyConfig),
    (WeightFollower, FollowerSettings, PolicyConfig),
    (Router, RouterSettings, RouterConfig),
    (ShardSearcher, ShardSettings, ShardConfig),
]
# A micro-batcher's settings are its server's (the router's encoder batches, a shard's searches), renamed.
BATCHERS: list[tuple[type, type, type]] = [
    (MicroBatcher, Batching, RouterConfig), (MicroBatcher, Batching, ShardConfig),
]
# The router's config with the two settings that have no default (an index, its shards) and no other; a shard's.
ROUTER = RouterConfig(index="index", shards=["shard:1"])
SHARD = ShardConfig(index="index")


def wrong_parameters(part: type, settings: type, config: type) -> list[str]:
    """What in ``part``'s constructor breaks the rule: take ``settings`` whole, as one parameter without a default,
    and no setting as a loose value or with a default of the constructor's own."""
    parameters = list(inspect.signature(part.__init__).parameters.values())[1:]  # type: ignore[misc]
    whole = [p for p in parameters if p.annotation in (settings, settings.__name__)]
    fields = {f.name for f in dataclasses.fields(settings)}
    names = {name for name, _, _ in settings_of(config)}
    wrong = [] if len(whole) == 1 else [f"{len(whole)} parameters of type {settings.__name__}, not one"]
    for p in parameters:
        if p in whole and p.default is not p.empty:
            wrong.append(f"{p.name}: the settings object has a default ({p.default!r})")
        if p.name in fields:
            wrong.append(f"{p.name}: a setting passed alone instead of in {settings.__name__}")
        elif p.name in names and p.default is not p.empty:
            wrong.append(f"{p.name}: a second default ({p.default!r}) of {config.__name__}'s setting")
    return wrong


@pytest.mark.parametrize(("part", "settings", "config"), PARTS + BATCHERS)
def test_each_part_takes_its_settings_whole_with_no_default_of_its_own(part: type, settings: type,
                                                                        config: type) -> None:
    assert not wrong_parameters(part, settings, config), part.__qualname__


@pytest.mark.parametrize(("part", "settings", "config"), PARTS)
def test_each_setting_of_a_part_is_its_services_setting_with_a_flag(part: type, settings: type, config: type) -> None:
    """Every field of the settings object is a setting of the service's config, taken from the one definition (so
    with one default and one help), with its flag on each command the config configures."""
    names = {name for name, _, _ in settings_of(config)}
    fields = [f.name for f in dataclasses.fields(settings)]
    assert set(fields) <= names, set(fields) - names
    assert {name: home_of(config, name) for name in fields} == {name: home_of(settings, name) for name in fields}
    parsers = [c.parser for c in commands() if c.config_class is config]
    assert parsers
    for parser in parsers:
        flags = {option for action in parser._actions for option in action.option_strings}
        assert {flag_name(name) for name in fields} <= flags


def test_the_parts_made_from_default_configs_have_the_configs_defaults() -> None:
    """The servers' way to each part (the config's method) gives it the config's values, which by default are the
    settings' defaults: nothing on the way has a default of its own."""
    policy = PolicyConfig()
    assert policy.worker_settings() == WorkerSettings() and policy.follower_settings() == FollowerSettings()
    assert ROUTER.router_settings() == RouterSettings()
    nothing = cast(Any, None)

    worker = RolloutWorker(nothing, nothing, nothing, nothing, nothing, policy.worker_settings())
    assert worker.settings == WorkerSettings()
    assert worker.leave_seconds + worker.margin == policy.grace_seconds
    follower = WeightFollower(nothing, nothing, "w", policy.follower_settings(), set_serving=nothing)
    assert follower.settings == FollowerSettings()

    router = Router(nothing, [nothing], ROUTER.router_settings())
    assert router.settings == RouterSettings()
    batcher = router._embedder.settings
    assert batcher == Batching(max_batch_rows=ROUTER.max_batch_rows, max_wait_s=ROUTER.max_wait_ms / 1000,
                               workers=ROUTER.encoder_workers, split_when_idle=ROUTER.encoder_split_when_idle)
    assert router._cache.size == ROUTER.query_cache_size
    router._embedder._executor.shutdown()

    # A searcher opens an index (tests/retriever/test_build.py makes one); what it is given and its batches are
    # the config's.
    assert SHARD.shard_settings() == ShardSettings()
    assert ShardSettings().search_batching() == Batching(max_batch_rows=SHARD.max_batch_rows,
                                                         max_wait_s=SHARD.max_wait_ms / 1000, workers=1,
                                                         split_when_idle=False)


def test_the_package_makes_a_parts_settings_only_from_its_config() -> None:
    """A settings object made by hand in the package (``WorkerSettings()`` in a server) would run the part on the
    defaults whatever the flags say: the servers get each from their config (``config.worker_settings()``)."""
    classes = {settings.__name__ for _, settings, _ in PARTS}
    made = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in classes:
                made.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not made


def test_one_registry_gives_the_loop_its_worker_and_the_setting_its_choices() -> None:
    """``loops.WORKERS`` is the one list of the loops: the setting accepts its keys and refuses anything else,
    naming them, and the default is one of them."""
    assert RolloutLoopSettings().rollout_loop in WORKERS
    for loop, worker in WORKERS.items():
        assert RolloutLoopSettings(rollout_loop=loop).rollout_loop == loop
        assert issubclass(worker, RolloutWorker)
    with pytest.raises(ValueError, match=f"rollout_loop must be one of {', '.join(WORKERS)}, got 'other'"):
        RolloutLoopSettings(rollout_loop="other")
