"""The settings of ``corpus ingest``, ``index build`` and ``index plan``: a bad value stops the command
with a message naming the setting, before anything is read, embedded or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.services.common import config
from ragr1.services.common.config import part_of
from ragr1.services.retriever.config import BuildConfig, PlanConfig, RouterConfig
from ragr1.services.retriever.index import IndexParams, IndexSpec


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["corpus", "ingest", "--format", "csv"], "format must be one of jsonl, kilt, got 'csv'"),
        (["corpus", "ingest", "--limit", "0"], "limit must be at least 1, got 0"),
        (["corpus", "ingest"], "out is required"),
        (["index", "build", "--out", "i"], "store is required"),
        (["index", "build", "--store", "s", "--out", "i", "--num-shards", "0"], "num_shards must be at least 1, got 0"),
        (["index", "build", "--store", "s", "--out", "i", "--index-type", "ivf"],
         "index_type must be one of flat, ivfpq, hnsw, got 'ivf'"),
        (["index", "build", "--store", "s", "--out", "i", "--gpu", "yes"], "gpu must be one of auto, never, always"),
        (["index", "build", "--store", "s", "--out", "i", "--encoder-backend", "tf"], "encoder_backend must be one of"),
        (["index", "plan", "--encoder", "bert-base"], "encoder must be one of all-MiniLM-L6-v2, intfloat/e5-base-v2"),
        (["index", "plan", "--shard-counts", "1,0"], "shard_counts must list positive counts, got [1, 0]"),
        (["index", "plan", "--shard-counts", "four"], "config field 'shard_counts'"),
        (["index", "plan", "--index-type", "flat,annoy"], "index_type must be one of flat, ivfpq, hnsw, got 'annoy'"),
        (["index", "plan", "--recall-pq-m", "50"], "recall_pq_m must divide 384"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_build_defaults_are_the_index_s_own() -> None:
    built = BuildConfig(store="s", out="i")
    assert part_of(IndexSpec, built, IndexParams) == IndexSpec()
    assert built.encoder_settings().max_passage_tokens > 0  # 0 keeps the preset's length


def test_plan_lists_come_from_every_layer(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text('{"index_type": ["flat", "hnsw"]}')
    loaded = config.load(PlanConfig, file=tmp_path / "plan.json", env={"RAGR1_SHARD_COUNTS": "2, 16"})
    assert (loaded.index_type, loaded.shard_counts) == (["flat", "hnsw"], [2, 16])


def test_one_shard_address_with_its_number_left_open_names_every_shard_of_the_index() -> None:
    router = RouterConfig(index="i", shards=["retriever-shard-{shard}:50061"])
    assert router.shard_addresses(3) == [f"retriever-shard-{i}:50061" for i in range(3)]
    listed = RouterConfig(index="i", shards=["a:1", "b:1"])
    assert listed.shard_addresses(3) == ["a:1", "b:1"]  # the server refuses the count that does not match
    with pytest.raises(ValueError, match="not both"):
        RouterConfig(index="i", shards=["a:1", "shard-{shard}:1"])
