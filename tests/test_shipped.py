"""The QA record layout: every reader of QA files names a record's data set, and its question's type, the same
way."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ragr1.services.trainer.data import load_qa_tasks, load_tasks
from ragr1.shipped import (
    BRIDGE,
    COMPARISON,
    EVAL_BENCHMARKS,
    QUESTION_TYPES,
    SINGLE_HOP,
    eval_path,
    move_into_place,
    question_type,
    read_jsonl,
    record_source,
    train_path,
)
from ragr1.stack.evaluate import load_questions
from ragr1.stack.prepare import qa_records, write_prompts


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
    prompts, _ = write_prompts(qa_records([path]), tmp_path / "out")
    assert [r["data_source"] for r in read_jsonl(prompts)] == expected


def test_every_shipped_training_question_has_its_data_sets_type() -> None:
    types: dict[str, dict[str, set[str]]] = {}  # data set -> question type -> the file's own labels
    for name in ("hotpotqa", "musique", "popqa"):
        path = train_path(name)
        for record in read_jsonl(path):
            kind = question_type(record, record_source(record, path))
            types.setdefault(name, {}).setdefault(kind, set()).add(record["type"])
    # HotpotQA labels its questions by these very names; both kinds are in its file.
    assert types["hotpotqa"] == {BRIDGE: {BRIDGE}, COMPARISON: {COMPARISON}}
    # MuSiQue's hop counts (2hop, 3hop1, 4hop3 ...) are all chains; PopQA's relations (birthplace, occupation)
    # one fact each.
    assert set(types["musique"]) == {BRIDGE} and len(types["musique"][BRIDGE]) > 1
    assert all(label.split("hop")[0].isdigit() for label in types["musique"][BRIDGE])
    assert set(types["popqa"]) == {SINGLE_HOP} and len(types["popqa"][SINGLE_HOP]) > 1


def test_a_question_type_comes_from_the_record_then_its_label_then_its_data_set() -> None:
    first = next(read_jsonl(train_path("hotpotqa")))
    assert question_type(first) == first["type"]
    # A file this project wrote says it outright; that wins over a data set's own label.
    assert question_type(first | {"question_type": COMPARISON, "type": BRIDGE}) == COMPARISON
    assert question_type(first | {"type": "3hop1"}) == BRIDGE
    # The evaluation files carry no label: PopQA's and MuSiQue's questions are one type by construction, the
    # other benchmarks' are not known.
    for name in EVAL_BENCHMARKS:
        path = eval_path(name)
        kinds = {question_type(r, record_source(r, path)) for r in read_jsonl(path, limit=20)}
        assert kinds == {{"popqa": SINGLE_HOP, "musique": BRIDGE}.get(name, "")}, name
    assert question_type({"question": "Who?", "type": "no such label"}, "mine") == ""
    assert set(QUESTION_TYPES) == {SINGLE_HOP, BRIDGE, COMPARISON}


def test_the_question_type_goes_with_every_task_question_and_prompt(tmp_path: Path) -> None:
    hotpot = list(read_jsonl(train_path("hotpotqa")))
    records = [next(r for r in hotpot if r["type"] == kind) for kind in (BRIDGE, COMPARISON)]
    unlabelled = {k: v for k, v in hotpot[0].items() if k != "type"} | {"dataset": "mine"}
    records += [next(read_jsonl(train_path("popqa"))), unlabelled]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    expected = [BRIDGE, COMPARISON, SINGLE_HOP, ""]

    assert [t.question_type for t in load_qa_tasks(path, "multi")] == expected
    assert [q.question_type for q in load_questions(path)] == expected
    written, parquet = write_prompts(qa_records([path]), tmp_path / "out")
    assert [r["question_type"] for r in read_jsonl(written)] == expected
    # The prepared files say it outright, and read back the same.
    assert [t.question_type for t in load_qa_tasks(written, "single")] == expected
    assert [t.question_type for t in load_tasks(parquet["multi"], "multi")] == expected


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
