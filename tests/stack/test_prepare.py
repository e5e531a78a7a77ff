"""`ragr1 data prepare` writes files the trainer reads back as it would have built them itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragr1.agent.information import TOKENS_PER_QUERY, TOP_K, InformationFormat
from ragr1.data import train_path
from ragr1.services.trainer import data
from ragr1.stack.prepare import prepare


def test_prepared_files_round_trip_into_the_trainer(tmp_path: Path, tokenizer: Any) -> None:
    done = prepare(["hotpotqa", "popqa"], tmp_path, limit=2)
    assert done.questions == 4 and done.trajectories == 8
    for mode in ("single", "multi"):
        from_jsonl = data.load_tasks(done.prompts, mode)
        from_parquet = data.load_tasks(done.parquet[mode], mode)
        assert [(t.question, list(t.golden_answers)) for t in from_parquet] == [
            (t.question, list(t.golden_answers)) for t in from_jsonl
        ]
        assert {t.data_source for t in from_jsonl} == {"hotpotqa", "popqa"}

    items = [q for name in ("hotpotqa", "popqa") for q in data.load_supported_questions(train_path(name), 2)]
    information = InformationFormat(tokenizer, TOKENS_PER_QUERY)
    built = data.tokenize_trajectories(tokenizer, data.sft_trajectories(items, ("single", "multi"), information, TOP_K))
    loaded = data.tokenize_trajectories(tokenizer, data.load_trajectories(done.sft))
    assert [(s.prompt_ids, s.response_ids, s.loss_mask) for s in loaded] == [
        (s.prompt_ids, s.response_ids, s.loss_mask) for s in built
    ]
    assert data.is_trajectory_file(done.sft) and not data.is_trajectory_file(done.prompts)


def test_a_bad_record_names_its_file_line_and_field(tmp_path: Path) -> None:
    broken = tmp_path / "mine.jsonl"
    broken.write_text(json.dumps({"question": "Who?", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"mine.jsonl:1: .*paragraphs"):
        prepare([str(broken)], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        prepare([str(tmp_path / "nope.jsonl")], tmp_path / "out")
