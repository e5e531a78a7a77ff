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
from ragr1.services.retriever.build import build_index, embed_store, embeddings_cache_dir
from ragr1.services.retriever.corpus import PassageStore, read_corpus, write_store
from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, EncoderSettings, preset
from ragr1.services.retriever.importer import import_index
from ragr1.shipped import corpus_path, read_jsonl, train_path
from tests.retriever.processes import start_router, start_shards

SLICE = 2000
EXTRA_QUESTIONS = 100
# The IVF indexes of the slice: IVF_LISTS lists (about 62 passages each), IVF_PROBES probed.
IVF_LISTS = 32
IVF_PROBES = 4


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


@pytest.fixture(scope="session")
def ivf_dirs(
    store: PassageStore, settings: EncoderSettings, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The slice as one IVF shard of each kind, ``IVF{IVF_LISTS},PQ64x8`` (what ``ragr1 index build`` makes) and
    ``IVF{IVF_LISTS},Flat``, inner product, imported from FAISS files as ``ragr1 index import`` does; the manifest
    directory of each (``ivfpq``, ``ivfflat``).

    The coarse centroids are passages spread over the slice and the PQ codebooks their residuals (k-means' own
    starting points) rather than k-means' result: this faiss-cpu build trains 8-bit codebooks for minutes on a busy
    host (``test_build``), and what the codes mean changes nothing the tests of the search check."""
    import faiss
    import numpy as np

    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings), progress=False).rows(0, len(store))
    root = tmp_path_factory.mktemp("ivf")
    centroids = vectors[np.linspace(0, len(vectors) - 1, IVF_LISTS).astype(int)]
    out = {}
    for kind, codes in (("ivfpq", "PQ64x8"), ("ivfflat", "Flat")):
        index = faiss.index_factory(vectors.shape[1], f"IVF{IVF_LISTS},{codes}", faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.downcast_index(index)
        ivf.quantizer.add(centroids)
        if kind == "ivfpq":
            pq = ivf.pq
            picked = vectors[np.linspace(1, len(vectors) - 1, pq.ksub).astype(int)]
            _, nearest = ivf.quantizer.search(picked, 1)
            books = (picked - centroids[nearest[:, 0]]).reshape(pq.ksub, pq.M, pq.dsub).transpose(1, 0, 2)
            faiss.copy_array_to_vector(np.ascontiguousarray(books).ravel(), pq.centroids)
        ivf.is_trained = True
        index.add(vectors)
        ivf.nprobe = IVF_PROBES
        source = root / f"{kind}.faiss"
        faiss.write_index(index, str(source))
        import_index([source], root / kind, settings, num_shards=1, store=store, progress=False)
        out[kind] = root / kind
    return out


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
