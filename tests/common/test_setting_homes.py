"""Every setting of every command has one home: one field definition gives its default and its help.

A command that passes a setting on to another under the same name (``ragr1 up --max-turns`` to the policy)
takes the other's definition (``same_as``); a command that runs another takes its whole config as a section
(``ragr1 demo --ppo.actor-lr``). Two commands may have settings of the same name only where the name means a
different setting there, each listed below with why.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect

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

