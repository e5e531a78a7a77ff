from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.manifest import LoadedManifest


def test_ingest_then_build_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["corpus", "ingest", "--limit", "30", "--out", str(tmp_path / "store")]) == 0
    assert len(PassageStore(tmp_path / "store")) == 30
    # Settings from all three layers: a file, the environment, flags.
    (tmp_path / "build.yaml").write_text("max_passage_tokens: 32\nembeddings_dir: " + str(tmp_path / "emb") + "\n")
    monkeypatch.setenv("RAGR1_INDEX_TYPE", "hnsw")
    args = ["index", "build", "--config", str(tmp_path / "build.yaml"), "--store", str(tmp_path / "store")]
    assert main([*args, "--out", str(tmp_path / "index"), "--num-shards", "2"]) == 0
    manifest = LoadedManifest(tmp_path / "index").manifest
    assert manifest.num_shards == 2 and manifest.index.index_type == "hnsw"
    assert manifest.encoder.max_passage_tokens == 32
    assert (tmp_path / "emb").is_dir()
    assert "manifest" in capsys.readouterr().out


def test_ingest_reads_every_input_from_a_comma_separated_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list setting is one value on the command line (``--input a,b,c``); a file and the environment reach
    the command too."""
    parts = []
    for name in ("a", "b", "c"):
        parts.append(tmp_path / f"{name}.jsonl")
        parts[-1].write_text(json.dumps({"id": name, "title": name.upper(), "text": f"passage {name}"}) + "\n")
    (tmp_path / "ingest.yaml").write_text("limit: 2\n")
    monkeypatch.setenv("RAGR1_OUT", str(tmp_path / "store"))
    args = ["corpus", "ingest", "--config", str(tmp_path / "ingest.yaml"), "--input", ",".join(map(str, parts))]
    assert main(args) == 0
    assert [p.id for p in PassageStore(tmp_path / "store")] == ["a", "b"]


def test_bad_command_line_values_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["corpus", "ingest", "--limit", "3", "--out", str(tmp_path / "store")]) == 0
    args = [
        "index",
        "build",
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(tmp_path / "i"),
        "--num-shards",
        "5",
    ]
    assert main(args) == 2
    assert "5 shards for 3 passages" in capsys.readouterr().err
    assert main(["serve", "retriever-shard", "--index", str(tmp_path / "nothing")]) == 2
    assert "ragr1 index build" in capsys.readouterr().err
