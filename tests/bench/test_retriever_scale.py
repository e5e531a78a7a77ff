"""The scale bench's synthetic index: what makes its answers checkable (a planted row is every question's exact
first hit), and the lookup that stands in for the encoder; the alternated bench at a toy size, whose Search-R1-style
server must answer from the same index as the router."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.retriever import alternate, scale
from ragr1.shipped import all_questions


def synthetic(rows: int, questions: int, dim: int = 384) -> scale.Synthetic:
    vectors = scale.random_unit(questions, dim, [7])
    return scale.Synthetic(rows, dim, [f"q{i}" for i in range(questions)], vectors, scale.plant(rows, questions))


def test_planted_rows_are_every_questions_exact_first_hit_and_chunks_are_deterministic() -> None:
    data = synthetic(rows=300_000, questions=64)
    index = np.concatenate(list(scale.chunks(data, scale.SEED)))
    assert index.shape == (data.rows, data.dim)
    assert np.allclose(np.linalg.norm(index, axis=1), 1, atol=1e-5)
    planted = index[data.planted]
    cosines = (planted * data.vectors).sum(axis=1)
    assert np.allclose(cosines, scale.PLANTED_COSINE, atol=1e-5)
    first = np.argmax(data.vectors @ index.T, axis=1)
    assert np.array_equal(first, data.planted)
    # The same rows whenever they are made: a source file reused from --work matches the rows planted now.
    again = np.concatenate(list(scale.chunks(data, scale.SEED)))
    assert np.array_equal(index, again)


def test_planted_rows_spread_over_every_shard_and_refuse_to_overflow() -> None:
    rows = scale.plant(1_000, 100)
    assert len(set(rows.tolist())) == 100 and rows.min() >= 0 and rows.max() < 1_000
    assert all(((rows >= lo) & (rows < lo + 125)).any() for lo in range(0, 1_000, 125))  # 8 shards
    with pytest.raises(ValueError, match="do not fit"):
        scale.plant(10, 11)


def test_the_lookup_encoder_returns_the_table_rows_and_names_a_missing_query() -> None:
    vectors = scale.random_unit(3, 8, [1])
    encoder = scale.LookupEncoder(["a", "b", "c"], vectors)
    assert np.array_equal(encoder.encode_queries(["c", "a", "c"]), vectors[[2, 0, 2]])
    with pytest.raises(KeyError, match="'d'"):
        encoder.encode_queries(["a", "d"])


def test_answer_shares_count_first_hits_against_the_expected_and_planted_rows_among_the_hits() -> None:
    data = synthetic(rows=100, questions=3)
    planted = [scale.passage_id(int(r)) for r in data.planted]
    calls = [np.array([0, 1]), np.array([2])]
    answers = [[[planted[0], "row-0"], ["row-0", planted[1]]], [[]]]
    assert scale.answer_shares(data, planted, calls, answers) == (1 / 3, 2 / 3)


def test_alternate_measures_the_search_r1_style_server_over_the_same_index_and_it_answers_the_planted_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A few questions: embedding all the shipped ones would take most of the test's time.
    questions = all_questions()[:60]
    monkeypatch.setattr(scale, "all_questions", lambda: questions)
    monkeypatch.setattr(sys, "argv", [
        "alternate.py", "--rows", "3000", "--types", "flat", "--repeats", "1", "--rounds", "2", "--checked-calls", "4",
        "--concurrency", "4", "--load-seconds", "1", "--work", str(tmp_path),
    ])
    alternate.main()
    out = capsys.readouterr().out
    number = r"\s*[0-9.]+"
    sizes = "".join(rf",? {n}q{number} \(x{number}\)" for n in scale.CALL_SIZES)
    # Every server's first hit is the planted row: a server over another index would miss them.
    for name in (alternate.ONE_PASS, alternate.BEFORE, alternate.SEARCH_R1):
        assert re.search(rf"flat\s+{name}\s+first hit 1\.000  {sizes}", out), (name, out)
    loaded = rf"{number}{number}{number}{number}\s+\d+\s+0"  # calls/s queries/s p50 p99 calls errors
    assert re.search(rf"flat {alternate.SEARCH_R1} c=4\s{loaded}\n", out), out
    assert re.search(rf"flat {alternate.ONE_PASS} c=4\s{loaded}\s+embed", out), out
    assert re.search(rf"1 client, median ms: 1q x{number}, 2q x{number}, 3q x{number}\n", out), out
    assert re.search(rf"c=4: calls/s x{number}; p99 x{number}; errors, both servers, all repeats: 0", out), out
