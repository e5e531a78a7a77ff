"""Prometheus metrics of the retriever router and shards (``ragr1_retriever_*``)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from ragr1.services.common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS

SEARCH_SECONDS = Histogram(
    "ragr1_retriever_search_seconds",
    "Router: time to answer one search call (embed, fan out, merge), by transport (grpc, http).",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
QUERIES_PER_CALL = Histogram(
    "ragr1_retriever_queries_per_call",
    "Router: queries in one search call.",
    buckets=SIZE_BUCKETS,
)
EMBED_SECONDS = Histogram(
    "ragr1_retriever_embed_seconds",
    "Router: time to embed one micro-batch of queries.",
    buckets=LATENCY_BUCKETS,
)
# Where a call's time goes; the stages run one after the other, so their means add up to the call's.
STAGES = ("embed", "fanout", "merge")
STAGE_SECONDS = Histogram(
    "ragr1_retriever_stage_seconds",
    "Router: time of one search call spent per stage: embed (waiting for and running the encoder "
    "batch), fanout (until every shard answered or gave up), merge (top-k over shards, dedup).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
SHARD_READY = Gauge(
    "ragr1_retriever_shard_ready",
    "Router: 1 when the shard answers its health check as SERVING, else 0 (polled), by shard.",
    ["shard"],
)
SHARD_CALL_SECONDS = Histogram(
    "ragr1_retriever_shard_call_seconds",
    "Router: time for one shard to answer a fan-out call, by shard.",
    ["shard"],
    buckets=LATENCY_BUCKETS,
)
SHARD_ERRORS = Counter(
    "ragr1_retriever_shard_errors_total",
    "Router: shard calls that failed or were late, by shard and reason.",
    ["shard", "reason"],
)
PARTIAL_RESPONSES = Counter(
    "ragr1_retriever_partial_responses_total",
    "Router: answers flagged partial because shards were missing.",
)
QUERY_CACHE = Counter(
    "ragr1_retriever_query_cache_lookups_total",
    "Router: query embedding cache lookups, by result (hit, miss).",
    ["result"],
)
SHARD_SEARCH_SECONDS = Histogram(
    "ragr1_retriever_shard_search_seconds",
    "Shard: time of one FAISS search over a micro-batch.",
    buckets=LATENCY_BUCKETS,
)
SHARD_TIME_TO_READY = Gauge(
    "ragr1_retriever_shard_time_to_ready_seconds",
    "Shard: seconds from the process start to serving (index opened, checked, on its device).",
)
SHARD_INDEX_MMAP = Gauge(
    "ragr1_retriever_shard_index_mmap",
    "Shard: 1 when the index is memory-mapped (pages read on demand), 0 when read into memory.",
)
BATCH_WAIT_SECONDS = Histogram(
    "ragr1_retriever_batch_wait_seconds",
    "Time a request waited to join a micro-batch, by stage (embed, shard).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
BATCH_ROWS = Histogram(
    "ragr1_retriever_batch_rows",
    "Query rows per micro-batch, by stage (embed, shard).",
    ["stage"],
    buckets=SIZE_BUCKETS,
)


def batch_observer(stage: str) -> Callable[[int, list[float]], None]:
    wait = BATCH_WAIT_SECONDS.labels(stage)
    rows_hist = BATCH_ROWS.labels(stage)

    def observe(rows: int, waits: list[float]) -> None:
        rows_hist.observe(rows)
        for w in waits:
            wait.observe(w)

    return observe
