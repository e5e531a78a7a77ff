"""The scale bench's synthetic index: what makes its answers checkable (a planted row is every question's exact
first hit), and the lookup that stands in for the encoder."""

from __future__ import annotations

import numpy as np
import pytest

from bench.retriever import scale


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
