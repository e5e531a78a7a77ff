"""``router.Router`` over in-process shards: sharded answers equal one exact index and brute force; recall; the
limits a call is checked against, the query cache, the encoder's batches, and the deadline a shard that does not
answer leaves. (Its processes, its HTTP API and shards that die: tests/retriever/test_services.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from ragr1.services.common.errors import InvalidArgument, Unavailable
from ragr1.services.retriever.build import embed_store, embeddings_cache_dir
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.encoder import Encoder, EncoderSettings
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.services.retriever.results import Hit
from ragr1.services.retriever.router import Router, RouterSettings, SearchResult
from ragr1.services.retriever.shard import ShardSearcher, ShardSettings

TOP_K = 10
# Below the recall@5 of supporting titles that all-MiniLM-L6-v2 reaches on this slice (the test prints it),
# with room for another backend's rounding; a broken encoder or merge falls far below it.
MIN_RECALL_AT_5 = 0.75
# A router that embeds each call's queries in one batch and keeps none: the answers these tests compare depend
# on nothing else (int8 activations are scaled per batch).
ONE_BATCH = RouterSettings(query_cache_size=0, encoder_workers=1, encoder_split_when_idle=False)


class LocalShard:
    """A ShardSearcher as the router's backend, without the network."""

    def __init__(self, searcher: ShardSearcher) -> None:
        self.searcher = searcher

    async def search(self, embeddings: np.ndarray, top_k: int, omit_text: bool, timeout: float) -> list[list[Hit]]:
        return await self.searcher.search(embeddings, top_k, omit_text)


async def _search_all(
    index_dir: Path, encoder: Encoder, questions: list[str], top_k: int, **kwargs: object
) -> SearchResult:
    manifest = LoadedManifest(index_dir)
    searchers = [ShardSearcher(manifest, i, ShardSettings()) for i in range(manifest.manifest.num_shards)]
    router = Router(encoder, [LocalShard(s) for s in searchers], ONE_BATCH)
    try:
        return await router.search(questions, top_k, **kwargs)  # type: ignore[arg-type]
    finally:
        await router.aclose()
        for s in searchers:
            await s.aclose()


@pytest.fixture(scope="module")
def brute_force(
    store: PassageStore, settings: EncoderSettings, encoder: Encoder, questions: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows and scores by numpy over every passage embedding."""
    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings), progress=False).rows(0, len(store))
    scores = encoder.encode_queries(questions) @ vectors.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :TOP_K]
    return rows, np.take_along_axis(scores, rows, axis=1)


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_sharded_search_equals_one_exact_index_and_brute_force(
    num_shards: int,
    index_dirs: dict[int, Path],
    encoder: Encoder,
    store: PassageStore,
    questions: list[str],
    brute_force: tuple[np.ndarray, np.ndarray],
) -> None:
    assert len(questions) >= 300
    sharded = asyncio.run(_search_all(index_dirs[num_shards], encoder, questions, TOP_K))
    single = asyncio.run(_search_all(index_dirs[1], encoder, questions, TOP_K))
    rows, scores = brute_force
    assert not sharded.partial
    for q, hits in enumerate(sharded.results):
        assert [h.id for h in hits] == [h.id for h in single.results[q]]
        assert [h.id for h in hits] == [store[int(r)].id for r in rows[q]]
        np.testing.assert_allclose([h.score for h in hits], scores[q], atol=1e-5)
        assert {h.shard for h in hits} <= set(range(num_shards))
    first = sharded.results[0][0]
    assert first.text and first.title and store[int(rows[0][0])].text == first.text


def test_recall_at_5_of_supporting_titles(
    index_dirs: dict[int, Path], encoder: Encoder, hotpot_questions: list[dict]
) -> None:
    result = asyncio.run(_search_all(index_dirs[2], encoder, [q["question"] for q in hotpot_questions], 5))
    recalls = []
    for q, hits in zip(hotpot_questions, result.results, strict=True):
        titles = {h.title for h in hits}
        recalls.append(np.mean([t in titles for t in q["supporting_titles"]]))
    recall = float(np.mean(recalls))
    print(
        f"\nrecall@5 of supporting titles, {len(hotpot_questions)} HotpotQA questions, "
        f"all-MiniLM-L6-v2, 2,000 passages: {recall:.3f}"
    )
    assert recall >= MIN_RECALL_AT_5


def test_dedup_within_a_trajectory_and_omit_text(index_dirs: dict[int, Path], encoder: Encoder) -> None:
    queries = ["Neil Peart drummer of Rush", "Rush drummer Neil Peart", "Counterparts Rush album"]
    plain = asyncio.run(_search_all(index_dirs[2], encoder, queries, 3))
    assert {h.id for h in plain.results[0]} & {h.id for h in plain.results[1]}  # the same passages come back
    deduped = asyncio.run(_search_all(index_dirs[2], encoder, queries, 3, groups=[1, 1, 2], dedup=True, omit_text=True))
    first, second = ({h.id for h in r} for r in deduped.results[:2])
    assert not first & second
    assert all(len(r) == 3 for r in deduped.results)
    assert all(h.text == "" and h.title for r in deduped.results for h in r)


@pytest.mark.parametrize(
    ("queries", "top_k", "message"),
    [
        ([], 3, "queries is empty: send 1 to max_queries=4"),
        (["a"] * 5, 3, "too many queries: 5 > max_queries=4"),
        (["a", "  "], 3, r"queries\[1\] is empty"),
        (["a", "x" * 31], 3, r"queries\[1\] has 31 characters > max_query_chars=30"),
        (["a"], 0, r"top_k must be an integer in \[1, max_top_k=5\], got 0"),
        (["a"], 6, r"top_k must be an integer in \[1, max_top_k=5\], got 6"),
    ],
)
def test_bad_input_names_the_limit(queries: list[str], top_k: int, message: str, encoder: Encoder) -> None:
    # Validation comes first: no shard is ever asked.
    no_shard = LocalShard(None)  # type: ignore[arg-type]
    limits = dataclasses.replace(ONE_BATCH, max_queries=4, max_query_chars=30, max_top_k=5)
    router = Router(encoder, [no_shard], limits)
    with pytest.raises(InvalidArgument, match=message):
        asyncio.run(router.search(queries, top_k))


class CountingQueries:
    """The real encoder, counting the queries it embeds."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.embedded = 0

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        self.embedded += len(queries)
        return self.encoder.encode_queries(queries)


def test_query_cache_skips_the_encoder_for_repeated_queries(index_dirs: dict[int, Path], encoder: Encoder) -> None:
    counting = CountingQueries(encoder)

    async def run() -> tuple[SearchResult, SearchResult]:
        manifest = LoadedManifest(index_dirs[1])
        searcher = ShardSearcher(manifest, 0, ShardSettings())
        router = Router(counting, [LocalShard(searcher)], dataclasses.replace(ONE_BATCH, query_cache_size=2))
        try:
            first = await router.search(["Neil Peart", "Rush band", "Neil Peart"], 3)
            assert counting.embedded == 2  # a repeated query within a call is embedded once
            second = await router.search(["Rush band", "Neil Peart"], 3)
            assert counting.embedded == 2
            await router.search(["Toto", "Jeff Porcaro"], 3)  # evicts both (size 2)
            await router.search(["Neil Peart"], 3)
            assert counting.embedded == 5
            # Concurrent calls with the same new query share one embedding.
            await asyncio.gather(*(router.search(["Modern Drummer Hall of Fame"], 3) for _ in range(4)))
            assert counting.embedded == 6
            return first, second
        finally:
            await router.aclose()
            await searcher.aclose()

    first, second = asyncio.run(run())
    assert [h.id for h in first.results[1]] == [h.id for h in second.results[0]]
    assert [h.id for h in first.results[0]] == [h.id for h in first.results[2]]


def test_an_idle_router_splits_one_call_among_its_encoder_workers(
    index_dirs: dict[int, Path], encoder: Encoder
) -> None:
    questions = ["Neil Peart", "Which band released Counterparts?", "Jeff Porcaro", "Toto"]

    async def run(split: bool, cache: int) -> tuple[list[list[str]], list[int]]:
        counting = CountingQueries(encoder)
        sizes: list[int] = []

        class Recording:
            def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
                sizes.append(len(queries))
                return counting.encode_queries(queries)

        searcher = ShardSearcher(LoadedManifest(index_dirs[1]), 0, ShardSettings())
        router = Router(
            Recording(),
            [LocalShard(searcher)],
            dataclasses.replace(ONE_BATCH, encoder_workers=2, encoder_split_when_idle=split, query_cache_size=cache),
        )
        try:
            reply = await router.search(questions, 5)
            return [[h.id for h in hits] for hits in reply.results], sizes
        finally:
            await router.aclose()
            await searcher.aclose()

    whole, sizes = asyncio.run(run(False, 0))
    assert sizes == [4]
    for cache in (0, 10):
        split, sizes = asyncio.run(run(True, cache))
        assert sorted(sizes) == [2, 2]  # two idle workers, two queries each
        # int8 activations are scaled per batch: a rare near-tie may swap places, never more.
        assert all(len(set(a) & set(b)) >= 4 for a, b in zip(split, whole, strict=True))


class SilentShard:
    """A shard that is connected and never answers (a paused process), recording the time it was given."""

    def __init__(self) -> None:
        self.given: list[float] = []

    async def search(self, embeddings: np.ndarray, top_k: int, omit_text: bool, timeout: float) -> list[list[Hit]]:
        self.given.append(timeout)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_silent_shard_leaves_time_to_answer_before_the_callers_deadline(
    index_dirs: dict[int, Path], encoder: Encoder
) -> None:
    async def run() -> tuple[SearchResult, float, SilentShard]:
        searcher = ShardSearcher(LoadedManifest(index_dirs[1]), 0, ShardSettings())
        silent = SilentShard()
        partial = dataclasses.replace(ONE_BATCH, on_shard_failure="partial")
        router = Router(encoder, [LocalShard(searcher), silent], partial)
        try:
            started = asyncio.get_running_loop().time()
            reply = await router.search(["Neil Peart"], 3, timeout=2.0)
            return reply, asyncio.get_running_loop().time() - started, silent
        finally:
            await router.aclose()
            await searcher.aclose()

    reply, elapsed, silent = asyncio.run(run())
    assert reply.partial and reply.missing_shards == (1,) and len(reply.results[0]) == 3
    # 5% of the caller's 2 s is kept to merge and reply: the shards get at most 1.9 s of it, and the
    # answer comes back with that margin to spare (the client, whose clock started earlier, still waits).
    assert silent.given and max(silent.given) <= 1.9
    assert elapsed < 2.0


class Vectors:
    """An encoder of 384-d zeros: where only the shards' timing matters."""

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return np.zeros((len(queries), 384), dtype=np.float32)


def test_timeout_s_is_the_deadline_of_a_call_that_brings_none_and_caps_a_longer_one() -> None:
    """A silent shard is given what is left of ``timeout_s`` (less the share kept to reply), whether the call
    brings no deadline or a longer one; with every shard silent even a partial answer has nothing to answer from."""
    settings = dataclasses.replace(ONE_BATCH, timeout_s=0.5, on_shard_failure="partial")

    async def given(timeout: float | None, shards: int) -> tuple[list[float], float]:
        silent = [SilentShard() for _ in range(shards)]
        router = Router(Vectors(), silent, settings)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(Unavailable, match=f"{shards} of {shards} shards did not answer"):
                await router.search(["Neil Peart"], 3, timeout=timeout)
            return [t for s in silent for t in s.given], asyncio.get_running_loop().time() - started
        finally:
            await router.aclose()

    for timeout, shards in ((None, 1), (60.0, 2)):
        times, elapsed = asyncio.run(given(timeout, shards))
        assert len(times) == shards and max(times) <= 0.475, times
        assert elapsed < 1.0  # not the caller's minute
