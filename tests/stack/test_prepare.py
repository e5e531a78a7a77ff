"""`ragr1 data prepare` writes files the trainer reads back as it would have built them itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragr1.cli import main
from ragr1.protocol.information import InformationFormat
from ragr1.services.common.config import InformationSettings
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.trainer import data, sft_search
from ragr1.shipped import train_path
from ragr1.stack.prepare import prepare


def test_prepared_files_round_trip_into_the_trainer(
    tmp_path: Path, policy_model_dir: Path, tokenizer: Any, retriever_server: ServiceProcess
) -> None:
    # Through the command line: its --top-k, --tokens-per-query, --model and --retriever-address must reach the
    # trajectories.
    blocks = InformationSettings(top_k=2, tokens_per_query=100)
    assert main(["data", "prepare", "--train-files", "hotpotqa,popqa", "--out", str(tmp_path), "--limit", "2",
                 "--top-k", str(blocks.top_k), "--tokens-per-query", str(blocks.tokens_per_query),
                 "--model", str(policy_model_dir), "--retriever-address", retriever_server.target]) == 0
    prompts, sft = tmp_path / "prompts.jsonl", tmp_path / "sft.jsonl"
    for mode in ("single", "multi"):
        from_jsonl = data.load_tasks(prompts, mode)
        from_parquet = data.load_tasks(tmp_path / f"prompts-{mode}.parquet", mode)
        assert len(from_jsonl) == 4
        assert [(t.question, list(t.golden_answers)) for t in from_parquet] == [
            (t.question, list(t.golden_answers)) for t in from_jsonl
        ]
        assert {t.data_source for t in from_jsonl} == {"hotpotqa", "popqa"}

    items = [q for name in ("hotpotqa", "popqa") for q in data.load_supported_questions(train_path(name), 2)]
    information = InformationFormat(tokenizer, blocks.tokens_per_query)
    with RetrieverClient(retriever_server.target) as client:
        built = sft_search.search_trajectories(items, ("single", "multi"), information,
                                               sft_search.retriever_search(client, blocks.top_k))
    loaded = data.load_trajectories(sft)
    assert loaded == built.trajectories and loaded
    assert data.is_trajectory_file(sft) and not data.is_trajectory_file(prompts)


def test_a_bad_record_or_model_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    broken = tmp_path / "mine.jsonl"
    broken.write_text(json.dumps({"question": "Who?", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"mine.jsonl:1: .*paragraphs"):
        prepare([str(broken)], tmp_path / "out", InformationSettings())
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        prepare([str(tmp_path / "nope.jsonl")], tmp_path / "out", InformationSettings())
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        prepare(["hotpotqa"], tmp_path / "out", InformationSettings(), model=str(tmp_path))
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"search the retriever at {nobody}"):
        prepare(["hotpotqa"], tmp_path / "out", InformationSettings(), limit=1, retriever_address=nobody)
    assert not (tmp_path / "out").exists()
