"""Shared fixtures: a slice of the shipped corpus, its indexes (1, 2, 3 shards), real questions, and a
running retriever (a router over two shard processes) that the tests of its clients share.

The slice is the first ``SLICE`` passages of ``data/corpus``: the ten paragraphs (gold and
distractors) of the first ~200 HotpotQA training questions. Embeddings are cached under
``RAGR1_CACHE_DIR/embeddings`` keyed by the store checksum and encoder settings, so only the first
run of the suite embeds (the slow part); index builds from cached embeddings are quick.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever.build import build_index
from ragr1.services.retriever.corpus import PassageStore, read_corpus, write_store
from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, EncoderSettings, preset
from ragr1.shipped import corpus_path, read_jsonl, train_path
from tests.retriever.processes import start_router, start_shards

SLICE = 2000
EXTRA_QUESTIONS = 100


@pytest.fixture(scope="session")
def settings() -> EncoderSettings:
    return preset(DEFAULT_ENCODER)


@pytest.fixture(scope="session")
def encoder(settings: EncoderSettings) -> Encoder:
    return Encoder(settings, device="cpu")


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> PassageStore:
    return write_store(read_corpus([corpus_path()], limit=SLICE), tmp_path_factory.mktemp("store"), progress=False)


@pytest.fixture(scope="session")
def hotpot_questions(store: PassageStore) -> list[dict]:
    """HotpotQA training questions whose ten paragraphs are all in the slice."""
    ids = {p.id for p in store}
    return [q for q in read_jsonl(train_path("hotpotqa")) if all(p["pid"] in ids for p in q["paragraphs"])]


@pytest.fixture(scope="session")
def questions(hotpot_questions: list[dict]) -> list[str]:
    """A few hundred real questions: the HotpotQA ones plus PopQA ones (gold elsewhere: harder ranking)."""
    extra = [q["question"] for q in read_jsonl(train_path("popqa"), limit=EXTRA_QUESTIONS)]
    return [q["question"] for q in hotpot_questions] + extra


@pytest.fixture(scope="session")
def index_dirs(
    store: PassageStore, settings: EncoderSettings, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """Exact (flat) indexes of the slice with 1, 2 and 3 shards; the manifest directory of each."""
    root = tmp_path_factory.mktemp("indexes")
    return {n: build_index(store, settings, root / f"flat-{n}", num_shards=n, progress=False).parent for n in (1, 2, 3)}


@pytest.fixture()
def processes() -> Iterator[list[ServiceProcess]]:
    """Processes a test starts go here; all are stopped at the end of the test."""
    started: list[ServiceProcess] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def cluster(index_dirs: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A router process over two shard processes of the 2-shard index: its ``grpc`` target, ``http`` and
    ``metrics`` URLs and the ``shards``' targets. Shared by every test that only calls it."""
    logs = tmp_path_factory.mktemp("logs")
    started: list[ServiceProcess] = []
    try:
        shards = start_shards(index_dirs[2], 2, logs, started)
        yield {**start_router(index_dirs[2], shards, logs, started), "shards": shards}
    finally:
        for p in started:
            p.stop()
