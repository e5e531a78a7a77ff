"""The index the local stack serves, built once and cached: the shipped corpus, its first N passages,
or the passages with given ids (the demo's slice).

The cache key holds everything that changes the index (which passages, shard count, index type,
encoder settings), so a different request builds a different index and a finished one is reused.
A cached index whose manifest is unreadable is rebuilt, not served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from ragr1.shipped import cache_dir, cache_lock, corpus_path


def _selection_key(limit: int, ids: set[str] | None) -> str:
    if ids is not None:
        return "ids-" + hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:12]
    return f"first-{limit}" if limit > 0 else "all"


def ensure_index(limit: int, shards: int, index_type: str, max_passage_tokens: int,
                 ids: set[str] | None = None, progress: bool = True) -> Path:
    """Returns the directory of a built index (with ``manifest.json``), building it when needed."""
    from ragr1.protocol.information import Passage
    from ragr1.services.retriever.build import build_index
    from ragr1.services.retriever.corpus import PassageStore, read_corpus, write_store
    from ragr1.services.retriever.encoder import DEFAULT_ENCODER, preset
    from ragr1.services.retriever.index import IndexSpec
    from ragr1.services.retriever.manifest import LoadedManifest

    settings = dataclasses.replace(preset(DEFAULT_ENCODER), max_passage_tokens=max_passage_tokens)
    selection = _selection_key(limit, ids)
    root = cache_dir() / "stack"
    store_dir = root / f"store-{selection}"
    index_dir = root / f"index-{selection}-{shards}x{index_type}-{settings.key()}"

    def cached() -> bool:
        if not (index_dir / "manifest.json").exists():
            return False
        try:
            LoadedManifest(index_dir)
            return True
        except (ValueError, KeyError, OSError) as exc:
            print(f"cached index {index_dir} is unreadable ({exc}); rebuilding it", flush=True)
            shutil.rmtree(index_dir)
            return False

    def passages() -> Iterator[Passage]:
        for record in read_corpus([corpus_path()], limit=None if ids is not None else (limit or None)):
            if ids is None or record.id in ids:
                yield record

    # Without the locks, two builders at once (test workers, two stacks started together) would write the
    # same store and shard files under each other; with them the later one finds the index finished. The
    # store is shared by the indexes of every shard count and type, hence its own lock.
    with cache_lock(index_dir):
        if cached():
            return index_dir
        with cache_lock(store_dir):
            try:
                store = PassageStore(store_dir)
            except (FileNotFoundError, ValueError):
                shutil.rmtree(store_dir, ignore_errors=True)
                store = write_store(passages(), store_dir, progress=progress)
        build_index(store, settings, index_dir, num_shards=shards, spec=IndexSpec(index_type), progress=progress)
    return index_dir
