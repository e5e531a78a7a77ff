"""The router's core: validate, embed all queries in one batch, fan out to every shard, merge.

No gRPC here: shards are reached through ``ShardBackend`` (a gRPC client in production, an
in-process ``ShardSearcher`` in tests and benchmarks), and errors are the common ``ServiceError``s
that the transports map to status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ragr1.services.common.config import Validated, check_at_least, setting
from ragr1.services.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from ragr1.services.retriever import metrics
from ragr1.services.retriever.batching import MicroBatcher
from ragr1.services.retriever.results import Hit, dedup_within_groups, merge_top_k

log = logging.getLogger(__name__)



# What the router does when a shard is down or late (RouterConfig.on_shard_failure).
FAILURE_MODES = ("unavailable", "partial")


@dataclasses.dataclass
class SearchLimits(Validated):
    """What one call may ask for (the router's config is one)."""

    max_queries: int = setting(512, "most queries in one call")
    max_query_chars: int = setting(2048, "longest query, in characters")
    max_top_k: int = setting(100, "largest top_k")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_queries", 1), ("max_query_chars", 1), ("max_top_k", 1)))


def validate(queries: Sequence[str], top_k: int, groups: Sequence[int], limits: SearchLimits) -> None:
    """Raises ``InvalidArgument`` naming the first limit the request breaks."""
    if not queries:
        raise InvalidArgument(f"queries is empty: send 1 to max_queries={limits.max_queries} queries")
    if len(queries) > limits.max_queries:
        raise InvalidArgument(f"too many queries: {len(queries)} > max_queries={limits.max_queries}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise InvalidArgument(f"queries[{i}] must be a string, got {type(query).__name__}")
        if not query.strip():
            raise InvalidArgument(f"queries[{i}] is empty")
        if len(query) > limits.max_query_chars:
            raise InvalidArgument(
                f"queries[{i}] has {len(query)} characters > max_query_chars={limits.max_query_chars}"
            )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= limits.max_top_k:
        raise InvalidArgument(f"top_k must be an integer in [1, max_top_k={limits.max_top_k}], got {top_k!r}")
    if groups and len(groups) != len(queries):
        raise InvalidArgument(
            f"groups must be empty or have one entry per query: got {len(groups)} for {len(queries)} queries"
        )


class QueryCache:
    """Least-recently-used query embeddings. RL rollouts repeat queries (GRPO samples of one prompt
    often open with the same search), and a hit skips the encoder, the bottleneck on a CPU."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, query: str) -> np.ndarray | None:
        vector = self._entries.get(query)
        if vector is None:
            if self.size:
                metrics.QUERY_CACHE.labels("miss").inc()
            return None
        self._entries.move_to_end(query)
        metrics.QUERY_CACHE.labels("hit").inc()
        return vector

    def put(self, query: str, vector: np.ndarray) -> None:
        if self.size <= 0:
            return
        self._entries[query] = vector
        self._entries.move_to_end(query)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class QueryEncoder(Protocol):
    def encode_queries(self, queries: Sequence[str]) -> np.ndarray: ...


class ShardBackend(Protocol):
    async def search(self, embeddings: np.ndarray, top_k: int, omit_text: bool, timeout: float) -> list[list[Hit]]:
        """Best-first hits per embedding row; must give up after ``timeout`` seconds."""
        ...


@dataclasses.dataclass(frozen=True)
class SearchResult:
    results: list[list[Hit]]
    partial: bool = False
    missing_shards: tuple[int, ...] = ()


class Router:
    def __init__(
        self,
        encoder: QueryEncoder,
        shards: Sequence[ShardBackend],
        *,
        limits: SearchLimits | None = None,
        on_shard_failure: str = "unavailable",
        default_timeout_s: float = 10.0,
        reply_margin: float = 0.05,
        min_reply_margin_s: float = 0.02,
        embed_batch_rows: int = 256,
        embed_wait_s: float = 0.002,
        embed_workers: int = 1,
        embed_split_when_idle: bool = False,
        query_cache_size: int = 0,
        lower_is_better: bool = False,
    ) -> None:
        if on_shard_failure not in FAILURE_MODES:
            raise ValueError(f"on_shard_failure must be one of {FAILURE_MODES}, got {on_shard_failure!r}")
        if not shards:
            raise ValueError("the router needs at least one shard")
        self.encoder = encoder
        self.shards = list(shards)
        self.limits = limits or SearchLimits()
        self.on_shard_failure = on_shard_failure
        # An imported L2 index scores by distance: its shards' lists merge smallest first.
        self.lower_is_better = lower_is_better
        self.default_timeout_s = default_timeout_s
        # Share of the caller's deadline kept back to merge and send the answer after the shards'
        # deadline, not a fixed time: on a busy host a partial answer (one shard paused) must still reach
        # the client before its deadline, not as DEADLINE_EXCEEDED.
        self.reply_margin = reply_margin
        self.min_reply_margin_s = min_reply_margin_s
        self._cache = QueryCache(query_cache_size)
        # Queries being embedded now: the batch's future and the query's row in it.
        self._inflight: dict[str, tuple[asyncio.Future[np.ndarray], int]] = {}
        self._embedder: MicroBatcher[Sequence[str], np.ndarray] = MicroBatcher(
            self._embed_batch,
            max_batch_rows=embed_batch_rows,
            max_wait_s=embed_wait_s,
            name="embed",
            on_batch=metrics.batch_observer("embed"),
            workers=embed_workers,
            split_when_idle=embed_split_when_idle,
        )

    def _embed_batch(self, calls: Sequence[Sequence[str]]) -> list[np.ndarray]:
        flat = [q for call in calls for q in call]
        with metrics.EMBED_SECONDS.time():
            vectors = self.encoder.encode_queries(flat)
        bounds = np.cumsum([0, *(len(c) for c in calls)])
        return [vectors[a:b] for a, b in itertools.pairwise(bounds)]

    async def _embed_rows(self, queries: list[str]) -> np.ndarray:
        """Each query submitted on its own, so that an idle encoder can split even one call's queries."""
        if len(queries) == 1 or not self._embedder.split_when_idle:
            return await self._embedder.submit(queries, rows=len(queries))
        rows = await asyncio.gather(*(self._embedder.submit([q], rows=1) for q in queries))
        return np.concatenate(rows)

    async def embed(self, queries: Sequence[str]) -> np.ndarray:
        """Query embeddings, computed in one encoder batch with other concurrent calls' queries.

        With the cache on, cached queries skip the encoder, and a query that another call is
        embedding right now waits for that result instead of being embedded twice.
        """
        unique = list(dict.fromkeys(queries))
        if self._cache.size <= 0:
            rows = await self._embed_rows(unique)
            found = dict(zip(unique, rows, strict=True))
            return np.stack([found[q] for q in queries])
        found = {}
        waiting: dict[str, tuple[asyncio.Future[np.ndarray], int]] = {}
        fresh = []
        for q in unique:
            vector = self._cache.get(q)
            if vector is not None:
                found[q] = vector
            elif q in self._inflight:
                waiting[q] = self._inflight[q]
            else:
                fresh.append(q)
        if fresh:
            task = asyncio.ensure_future(self._embed_rows(fresh))
            for i, q in enumerate(fresh):
                self._inflight[q] = waiting[q] = (task, i)
            task.add_done_callback(lambda t, batch=fresh: self._settle(t, batch))  # type: ignore[misc]
        for q, (future, i) in waiting.items():
            # Shielded: one caller giving up (its deadline) must not cancel the others' embedding.
            found[q] = (await asyncio.shield(future))[i]
        return np.stack([found[q] for q in queries])

    def _settle(self, task: asyncio.Future[np.ndarray], queries: list[str]) -> None:
        for q in queries:
            self._inflight.pop(q, None)
        if not task.cancelled() and task.exception() is None:
            for q, vector in zip(queries, task.result(), strict=True):
                self._cache.put(q, vector)

    async def search(
        self,
        queries: Sequence[str],
        top_k: int,
        *,
        groups: Sequence[int] = (),
        dedup: bool = False,
        omit_text: bool = False,
        timeout: float | None = None,
    ) -> SearchResult:
        validate(queries, top_k, groups, self.limits)
        metrics.QUERIES_PER_CALL.observe(len(queries))
        budget = self.default_timeout_s if timeout is None else min(timeout, self.default_timeout_s)
        started = time.perf_counter()
        deadline = started + budget - max(budget * self.reply_margin, self.min_reply_margin_s)
        try:
            embeddings = await asyncio.wait_for(self.embed(queries), max(deadline - time.perf_counter(), 0))
        except TimeoutError:
            raise DeadlineExceeded(
                f"embedding {len(queries)} queries took longer than the {budget:.3f} s deadline"
            ) from None
        embedded = time.perf_counter()
        metrics.STAGE_SECONDS.labels("embed").observe(embedded - started)
        group_ids = list(groups) if groups else list(range(len(queries)))
        fetch = top_k * max(Counter(group_ids).values()) if dedup else top_k
        answers = await asyncio.gather(
            *(self._call_shard(i, embeddings, fetch, omit_text, deadline) for i in range(len(self.shards)))
        )
        fanned_out = time.perf_counter()
        metrics.STAGE_SECONDS.labels("fanout").observe(fanned_out - embedded)
        missing = tuple(i for i, a in enumerate(answers) if isinstance(a, str))
        if missing and (self.on_shard_failure == "unavailable" or len(missing) == len(self.shards)):
            reasons = "; ".join(f"shard {i}: {answers[i]}" for i in missing)
            raise Unavailable(f"{len(missing)} of {len(self.shards)} shards did not answer ({reasons})")
        answered = [a for a in answers if not isinstance(a, str)]
        merged = merge_top_k(answered, fetch, self.lower_is_better)
        results = (
            dedup_within_groups(merged, group_ids, top_k, self.lower_is_better)
            if dedup
            else [m[:top_k] for m in merged]
        )
        if missing:
            metrics.PARTIAL_RESPONSES.inc()
        metrics.STAGE_SECONDS.labels("merge").observe(time.perf_counter() - fanned_out)
        return SearchResult(results, partial=bool(missing), missing_shards=missing)

    async def _call_shard(
        self, shard: int, embeddings: np.ndarray, top_k: int, omit_text: bool, deadline: float
    ) -> list[list[Hit]] | str:
        """The shard's hits, or why it gave none (a string)."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            metrics.SHARD_ERRORS.labels(str(shard), "deadline").inc()
            return "no time left before the deadline"
        started = time.perf_counter()
        try:
            hits = await asyncio.wait_for(self.shards[shard].search(embeddings, top_k, omit_text, remaining), remaining)
        except TimeoutError:
            metrics.SHARD_ERRORS.labels(str(shard), "deadline").inc()
            return f"no answer within {remaining:.3f} s"
        except Exception as exc:  # any failure of one shard is reported, never raised past the others
            metrics.SHARD_ERRORS.labels(str(shard), type(exc).__name__).inc()
            log.warning("shard %d failed: %s", shard, exc)
            return f"{type(exc).__name__}: {exc}"
        metrics.SHARD_CALL_SECONDS.labels(str(shard)).observe(time.perf_counter() - started)
        return hits

    async def aclose(self) -> None:
        await self._embedder.aclose()
