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

from ragr1.docgen.settings import commands
from ragr1.services.common.config import home_of, section_of

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
    "policy_replicas": "`ragr1 scale` has no default: a forgotten flag must not scale a running stack down to 1",
}


# Dataclass fields of the package that share a setting's name but are data, not settings: no command reads
# them from a flag, and no setting's default is copied into them.
RECORDS = {
    "Action.queries": "the queries of a parsed <search>",
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
        "max_turns": "ragr1.services.policy.agent.LoopConfig",
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
    }
    assert {name: homes[name] for name in expected} == {name: {home} for name, home in expected.items()}
