"""The QA record layout: every reader of QA files names a record's data set the same way."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ragr1.services.common.config import InformationSettings
from ragr1.services.trainer.data import load_qa_tasks
from ragr1.shipped import move_into_place, read_jsonl, train_path
from ragr1.stack.evaluate import load_questions
from ragr1.stack.prepare import prepare


def test_data_source_then_dataset_then_the_file_name(tmp_path: Path) -> None:
    first, second, third = read_jsonl(train_path("hotpotqa"), limit=3)  # they carry "dataset": "hotpotqa"
    first["data_source"] = "nq"
    del third["dataset"]
    path = tmp_path / "mine.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in (first, second, third))
    expected = ["nq", "hotpotqa", "mine"]

    assert [t.data_source for t in load_qa_tasks(path, "multi")] == expected
    assert [q.data_source for q in load_questions(path)] == expected
    done = prepare([str(path)], tmp_path / "out", InformationSettings())
    assert [r["data_source"] for r in read_jsonl(done.prompts)] == expected


def test_a_cache_entry_finished_twice_keeps_the_first_and_drops_the_second(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    first, second = tmp_path / ".tmp-1", tmp_path / ".tmp-2"
    for d, text in ((first, "first"), (second, "second")):
        d.mkdir()
        (d / "model.bin").write_text(text)
    move_into_place(first, target)
    move_into_place(second, target)  # another process got there first: no error, nothing mixed
    assert (target / "model.bin").read_text() == "first"
    assert not first.exists() and not second.exists()
    blocker = tmp_path / "file"
    blocker.write_text("not a cache entry")
    third = tmp_path / ".tmp-3"
    third.mkdir()
    with pytest.raises(OSError):
        move_into_place(third, blocker)
