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

from ragr1.services.common.config import Validated, check_at_least, check_choice, setting
from ragr1.services.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from ragr1.services.retriever import metrics
from ragr1.services.retriever.batching import Batching, MicroBatcher
from ragr1.services.retriever.results import Hit, dedup_within_groups, merge_top_k

log = logging.getLogger(__name__)

# What the router does when a shard is down or late (RouterSettings.on_shard_failure).
FAILURE_MODES = ("unavailable", "partial")
# Share of the caller's deadline kept back to merge and send the answer after the shards' deadline, not a
# fixed time: on a busy host a partial answer (one shard paused) must still reach the client before its
# deadline, not as DEADLINE_EXCEEDED; never less than the floor.
REPLY_MARGIN, MIN_REPLY_MARGIN_S = 0.05, 0.02


@dataclasses.dataclass
class SearchLimits(Validated):
    """What one call may ask for (the router's config is one)."""

    max_queries: int = setting(512, "most queries in one call")
    max_query_chars: int = setting(2048, "longest query, in characters")
    max_top_k: int = setting(100, "largest top_k")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_queries", 1), ("max_query_chars", 1), ("max_top_k", 1)))


@dataclasses.dataclass
class RouterSettings(SearchLimits):
    """How the router answers a call: its limits, its deadline, a shard that fails, the encoder's batches and the
    query cache. The router's config takes each of these definitions (``same_as``) and gives the router this
    object whole (``RouterConfig.router_settings``)."""

    timeout_s: float = setting(10.0, "deadline of a call that brings none (and cap of the caller's)")
    on_shard_failure: str = setting(
        "unavailable",
        "a shard down or late: 'unavailable' fails the call, "
        "'partial' answers from the other shards with the partial flag set",
    )
    max_batch_rows: int = setting(256, "most queries embedded in one encoder batch; 1 turns batching off")
    max_wait_ms: float = setting(2.0, "longest a call waits for others to join its encoder batch")
    query_cache_size: int = setting(10000, "query embeddings kept in an LRU cache; 0 turns it off")
    encoder_workers: int = setting(
        2, "encoder batches run in parallel, one thread each (torch and ONNX Runtime release the GIL)"
    )
    encoder_split_when_idle: bool = setting(
        True,
        "a batch taken while other encoder workers are idle is split among them: a call of 3 queries on "
        "an idle router costs about one query's encoding time instead of three",
    )

    def validate(self) -> None:
        super().validate()
        check_choice("on_shard_failure", self.on_shard_failure, FAILURE_MODES)
        check_at_least(self, (("max_batch_rows", 1), ("max_wait_ms", 0), ("encoder_workers", 1)))

    def embed_batching(self) -> Batching:
        return Batching(max_batch_rows=self.max_batch_rows, max_wait_s=self.max_wait_ms / 1000,
                        workers=self.encoder_workers, split_when_idle=self.encoder_split_when_idle)


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
        settings: RouterSettings,
        *,
        lower_is_better: bool = False,
    ) -> None:
        """``lower_is_better``: the index scores by distance (an imported L2 index), so its shards' lists merge
        smallest first."""
        if not shards:
            raise ValueError("the router needs at least one shard")
        self.encoder = encoder
        self.shards = list(shards)
        self.settings = settings
        self.lower_is_better = lower_is_better
        self._cache = QueryCache(settings.query_cache_size)
        # Queries being embedded now: the batch's future and the query's row in it.
        self._inflight: dict[str, tuple[asyncio.Future[np.ndarray], int]] = {}
        self._embedder: MicroBatcher[Sequence[str], np.ndarray] = MicroBatcher(
            self._embed_batch, settings.embed_batching(), name="embed", on_batch=metrics.batch_observer("embed"),
        )

    def _embed_batch(self, calls: Sequence[Sequence[str]]) -> list[np.ndarray]:
        flat = [q for call in calls for q in call]
        with metrics.EMBED_SECONDS.time():
            vectors = self.encoder.encode_queries(flat)
        bounds = np.cumsum([0, *(len(c) for c in calls)])
        return [vectors[a:b] for a, b in itertools.pairwise(bounds)]

    async def _embed_rows(self, queries: list[str]) -> np.ndarray:
        """Each query submitted on its own, so that an idle encoder can split even one call's queries."""
        if len(queries) == 1 or not self.settings.encoder_split_when_idle:
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
        validate(queries, top_k, groups, self.settings)
        metrics.QUERIES_PER_CALL.observe(len(queries))
        limit = self.settings.timeout_s
        budget = limit if timeout is None else min(timeout, limit)
        started = time.perf_counter()
        deadline = started + budget - max(budget * REPLY_MARGIN, MIN_REPLY_MARGIN_S)
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
        if missing and (self.settings.on_shard_failure == "unavailable" or len(missing) == len(self.shards)):
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
