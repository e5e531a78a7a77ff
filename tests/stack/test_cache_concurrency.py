"""Two real processes that build the same cache entry at once (the local stack's index: its passage store,
its embeddings and its FAISS shards) both end with the complete entry, identical, built once between them.

The suite runs on several pytest-xdist workers, and `ragr1 up` starts services together: either can ask for
an entry that another process is building at that moment.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from ragr1.services.retriever.encoder import DEFAULT_ENCODER, ensure_export, preset
from ragr1.shipped import ROOT
from tests.common.waiting import wait_for

PASSAGES = 12
SHARDS = 2

# Imports everything first and says so, then waits for the go: the two builds then start together, not one
# after the other's imports. Counts the passages it embedded and the stores and indexes it wrote itself.
CHILD = """
import hashlib, json, sys, time
from pathlib import Path
import ragr1.services.retriever.build as build
import ragr1.services.retriever.corpus as corpus
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.stack.index_cache import ensure_index

work = {"embedded": 0, "stores": 0, "indexes": 0}
encode, write_store, build_index = Encoder.encode_passages, corpus.write_store, build.build_index

def counting_encode(self, contents, **kw):
    work["embedded"] += len(contents)
    return encode(self, contents, **kw)

def counting(key, fn):
    def wrapped(*a, **kw):
        work[key] += 1
        return fn(*a, **kw)
    return wrapped

Encoder.encode_passages = counting_encode
corpus.write_store = counting("stores", write_store)
build.build_index = counting("indexes", build_index)
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.01)
index = ensure_index(int(sys.argv[3]), int(sys.argv[4]), "flat", 128, progress=False)
LoadedManifest(index)  # complete: every shard file there, of the size and checksum the manifest says
seen = {str(p.relative_to(index)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(index.rglob("*")) if p.is_file()}
print(json.dumps({"index": str(index), "files": seen, **work}))
"""


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_two_processes_building_one_index_at_once_both_get_it_whole_and_it_is_built_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    # The encoder's export is its own cache entry (locked the same way); shared here so that the test pays
    # for the store, embeddings and index only.
    (cache / "encoders").symlink_to(ensure_export(preset(DEFAULT_ENCODER)).parent, target_is_directory=True)
    env = {**os.environ, "RAGR1_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / f"ready-{i}"), str(go), str(PASSAGES), str(SHARDS)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]

    def started() -> bool:
        assert all(c.poll() is None for c in children), [c.communicate() for c in children]
        return all((tmp_path / f"ready-{i}").exists() for i in range(2))

    wait_for(started, "the builders did not start", 120, 0.05)
    go.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    index = Path(results[0]["index"])
    assert results[1]["index"] == str(index)
    manifest = json.loads((index / "manifest.json").read_text())
    assert len(manifest["shards"]) == SHARDS
    # Built once between them: the other process waited and found it finished.
    assert sum(r["embedded"] for r in results) == PASSAGES
    assert sum(r["stores"] for r in results) == 1
    assert sum(r["indexes"] for r in results) == 1
    # Nothing half-written or left over from a build beside the entries.
    entries = tree_digest(cache / "stack")
    assert not [name for name in entries if name.endswith(".tmp") or "/.tmp-" in name]
    # The one that waited saw, when ensure_index returned, the very files the builder finished with.
    for shard in manifest["shards"]:
        assert shard["file"] in results[0]["files"], shard
    assert results[0]["files"] == results[1]["files"] == tree_digest(index)
