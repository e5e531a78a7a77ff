"""``ragr1 data prepare``: the files the trainer reads, from the shipped training sets or a user's.

- ``prompts.jsonl``: RL prompts in the QA layout (``ragr1 train ppo --prompts-file``);
- ``prompts-single.parquet``, ``prompts-multi.parquet``: the same in Search-R1 / RAG-R1's parquet
  layout (the chat prompt of each mode), for their existing training scripts;
- ``sft.jsonl``: format-learning trajectories in both modes, searched through a running retriever as
  rollouts search (``ragr1.services.trainer.sft_search``), as text pieces marked generated or not
  (``ragr1 train sft --train-files sft.jsonl``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ragr1.protocol.prompts import MAX_TURNS
from ragr1.services.common.config import InformationSettings
from ragr1.shipped import question_type, read_jsonl, record_source, train_source
from ragr1.stack.questions import write_jsonl

QA_FIELDS = ("id", "question", "golden_answers", "supporting_titles", "data_source", "question_type")


@dataclasses.dataclass(frozen=True)
class Prepared:
    prompts: Path
    parquet: dict[str, Path]
    sft: Path
    questions: int
    trajectories: int
    # Trajectories searched; those whose blocks showed no answer alias are not written.
    searched: int


def qa_records(paths: list[Path], limit: int | None = None) -> list[dict[str, Any]]:
    """The RL prompts' records of the QA files: their QA fields, with each record's source and question type."""
    records = []
    for path in paths:
        for record in read_jsonl(path, limit):
            source = record_source(record, path)
            records.append({k: record[k] for k in QA_FIELDS if k in record}
                           | {"data_source": source, "question_type": question_type(record, source)})
    return records


def write_prompts(records: list[dict[str, Any]], out: Path) -> tuple[Path, dict[str, Path]]:
    """``prompts.jsonl`` and the two parquet files of ``records``."""
    from ragr1.services.trainer import data

    out.mkdir(parents=True, exist_ok=True)
    prompts = write_jsonl(records, out / "prompts.jsonl")
    parquet = {}
    for mode in ("single", "multi"):
        parquet[mode] = out / f"prompts-{mode}.parquet"
        data.write_parquet(data.load_qa_tasks(prompts, mode), parquet[mode])
    return prompts, parquet


def prepare(sources: list[str], out: Path, blocks: InformationSettings, model: str = "",
            limit: int | None = None, retriever_address: str = "", max_turns: int = MAX_TURNS) -> Prepared:
    """The information blocks of the trajectories are cut per query with the tokenizer of ``model`` (the
    policy's ``--model``), as the policy cuts them, and show what the retriever at ``retriever_address``
    returns. Every input is read before transformers is imported (seconds), and the trajectories are searched
    before anything is written, so that a bad file, model folder or retriever leaves nothing behind."""
    from ragr1.model_paths import policy_checkpoint
    from ragr1.protocol.information import InformationFormat
    from ragr1.services.trainer import data, sft_search

    paths = [train_source(s) for s in sources]  # every file is found before anything is written
    checkpoint = policy_checkpoint(model)
    supported = [q for p in paths for q in data.load_supported_questions(p, limit)]
    records = qa_records(paths, limit)
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(checkpoint))
    information = InformationFormat(tokenizer, blocks.tokens_per_query)
    searched = sft_search.search_through(retriever_address, supported, ("single", "multi"), information,
                                         top_k=blocks.top_k, max_rounds=max_turns)
    prompts, parquet = write_prompts(records, out)
    sft = write_jsonl((t.to_record() for t in searched.trajectories), out / "sft.jsonl")
    return Prepared(prompts, parquet, sft, len(records), len(searched.trajectories), len(supported) * 2)
