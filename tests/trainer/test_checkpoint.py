"""checkpoint.py on its own: what a restarted trainer and every replica rely on. A reader sees only complete
versions, versions only move forward, the weights' digest is recorded with them, pruning spares what replicas
still serve, and the trainer's state comes back as it was saved."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.trainer.checkpoint import META, POLICY_SHA256, Checkpointer, policy_dir, version_dir


def weights(content: str) -> Callable[[Path], None]:
    """A ``write_policy`` that writes one weights file holding ``content``."""

    def write(directory: Path) -> None:
        (directory / "model.safetensors").write_text(content)
        (directory / "config.json").write_text("{}")

    return write


def test_a_saved_version_is_the_latest_with_its_meta_and_the_digest_of_its_weights(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    assert checkpoints.latest() is None and checkpoints.versions() == []
    path = checkpoints.save(3, {"step": 3, "trained_ids": ["a", "b"]}, weights("v3"), {"optimiser": [1, 2]})
    assert path == version_dir(tmp_path, 3) == tmp_path / "v000003"
    latest = checkpoints.latest()
    assert latest is not None
    found, meta = latest
    assert found == path and (meta["version"], meta["step"], meta["trained_ids"]) == (3, 3, ["a", "b"])
    assert (policy_dir(path) / "model.safetensors").read_text() == "v3"
    # The digest replicas check what they load against is the one of the files written.
    assert meta[POLICY_SHA256] == checkpoint_sha256(policy_dir(path)) == checkpoints.policy_sha256(path)
    assert checkpoints.load_state(path) == {"optimiser": [1, 2]}


def test_a_failed_write_leaves_no_version_and_nothing_half_written(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    checkpoints.save(1, {}, weights("v1"), None)

    def broken(directory: Path) -> None:
        (directory / "model.safetensors").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoints.save(2, {}, broken, None)
    assert checkpoints.versions() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["v000001"]  # the temporary directory went with it


def test_versions_only_move_forward(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    checkpoints.save(1, {}, weights("first"), None)
    with pytest.raises(FileExistsError, match="v000001 already exists"):
        checkpoints.save(1, {}, weights("second"), None)
    assert (policy_dir(version_dir(tmp_path, 1)) / "model.safetensors").read_text() == "first"


def test_readers_see_only_complete_versions_and_leftovers_of_a_crash_go_at_the_next_save(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    checkpoints.save(1, {}, weights("v1"), None)
    # A trainer killed mid-write leaves its temporary directory; a directory without meta.json is not a version.
    (tmp_path / ".tmp-v000002-x").mkdir()
    (tmp_path / "v000005").mkdir()
    assert checkpoints.versions() == [1] and checkpoints.latest() is not None
    checkpoints.save(2, {}, weights("v2"), None)
    assert checkpoints.versions() == [1, 2]
    assert not list(tmp_path.glob(".tmp-*"))


def test_pruning_keeps_the_newest_and_every_version_a_replica_still_serves(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path, keep=2)
    for version in (1, 2, 3):
        checkpoints.save(version, {}, weights(f"v{version}"), None)
    assert checkpoints.versions() == [2, 3]
    checkpoints.save(4, {}, weights("v4"), None, in_use={2})
    assert checkpoints.versions() == [2, 3, 4]  # 2 is served somewhere: not pruned from under it
    checkpoints.save(5, {}, weights("v5"), None)
    assert checkpoints.versions() == [4, 5]


def test_a_version_saved_without_state_or_digest_still_reads(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    path = checkpoints.save(1, {}, weights("v1"), None)
    assert checkpoints.load_state(path) is None
    # A checkpoint written before the digest was recorded: computed from the files instead.
    meta = json.loads((path / META).read_text())
    del meta[POLICY_SHA256]
    (path / META).write_text(json.dumps(meta))
    assert checkpoints.policy_sha256(path) == checkpoint_sha256(policy_dir(path))
