from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ragr1.protocol.information import Passage
from ragr1.services.retriever.corpus import (
    PassageStore,
    read_corpus,
    record_from_json,
    split_kilt_page,
    write_store,
)
from ragr1.shipped import corpus_path, read_jsonl


def test_both_jsonl_layouts_give_the_same_passage() -> None:
    record = next(read_jsonl(corpus_path()))
    from_fields = record_from_json({"id": record["id"], "title": record["title"], "text": record["text"]}, "x")
    from_contents = record_from_json({"id": record["id"], "contents": record["contents"]}, "x")
    assert from_fields == from_contents == Passage(record["id"], record["title"], record["text"])
    assert from_fields.contents == record["contents"]


def test_a_passage_without_text_is_reported_with_its_line() -> None:
    with pytest.raises(ValueError, match=r"corpus.jsonl:7: passage p1 has neither 'contents'"):
        record_from_json({"id": "p1", "title": "T"}, "corpus.jsonl:7")


def test_kilt_page_is_split_into_100_word_passages_with_the_title() -> None:
    real = next(read_jsonl(corpus_path()))  # a real Wikipedia paragraph, made into a KILT page
    words = real["text"].split()
    page = {
        "wikipedia_id": "4242",
        "wikipedia_title": real["title"],
        "text": [real["title"] + "\n", real["text"] + "\n", "Section::::Career.\n", real["text"] + "\n"],
    }
    passages = split_kilt_page(page)
    all_words = words + words
    assert [p.id for p in passages] == [f"4242_{i}" for i in range((len(all_words) + 99) // 100)]
    assert all(p.title == real["title"] for p in passages)
    assert all(len(p.text.split()) == 100 for p in passages[:-1])
    assert " ".join(p.text for p in passages).split() == all_words
    assert "Section::::" not in " ".join(p.text for p in passages)


def test_kilt_files_are_read_through_the_same_reader(tmp_path: Path) -> None:
    path = tmp_path / "kilt.jsonl.gz"
    pages = [{"wikipedia_id": str(i), "wikipedia_title": f"T{i}", "text": [f"T{i}", "word " * 150]} for i in range(3)]
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(p) + "\n" for p in pages)
    passages = list(read_corpus([path], fmt="kilt", words=100))
    assert [p.id for p in passages] == ["0_0", "0_1", "1_0", "1_1", "2_0", "2_1"]
    assert [len(p.text.split()) for p in passages[:2]] == [100, 50]


def test_store_gives_random_access_by_row(tmp_path: Path) -> None:
    records = list(read_corpus([corpus_path()], limit=300))
    store = write_store(records, tmp_path / "s", progress=False)
    assert len(store) == 300
    for row in (0, 299, 17, 150):
        assert store[row] == records[row]
    reopened = PassageStore(tmp_path / "s")
    assert reopened.sha256 == store.sha256 and reopened[42] == records[42]
    with pytest.raises(IndexError, match="outside"):
        store[300]


def test_store_refuses_duplicate_ids_and_leaves_no_half_store(tmp_path: Path) -> None:
    dup = [Passage("a", "T", "x"), Passage("a", "T", "y")]
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        write_store(dup, tmp_path / "s", progress=False)
    with pytest.raises(FileNotFoundError, match="not a passage store"):
        PassageStore(tmp_path / "s")
