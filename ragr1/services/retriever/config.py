"""Settings of the retriever shard and router servers."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import setting
from ragr1.services.common.server import ServerConfig

CHECKSUM_MODES = ("start", "background", "off")
# What the router does when a shard is down or late (RouterConfig.on_shard_failure).
FAILURE_MODES = ("unavailable", "partial")


def require_index(index: str) -> None:
    if not index:
        raise ValueError("index is required (--index): the index directory or its manifest.json")


@dataclasses.dataclass
class ShardConfig(ServerConfig):
    port: int = setting(ports.RETRIEVER_SHARD, "gRPC port (shard i conventionally on RETRIEVER_SHARD + i)")
    index: str = setting("", "index directory or its manifest.json (from `ragr1 index build`)")
    shard: int = setting(0, "which shard of the index to serve, 0-based")
    gpu: str = setting("auto", "FAISS on GPU: auto (when one is visible), never, always")
    checksum: str = setting(
        "background",
        "when to check the shard file's SHA-256 against the manifest (its size is always checked at start): "
        "'start' before serving (reads the whole file), 'background' while serving (a mismatch stops the "
        "shard), 'off'",
    )
    mmap: bool = setting(
        True, "memory-map the index (ready in seconds, pages read on demand) instead of reading it whole"
    )
    max_batch_rows: int = setting(256, "most query rows in one index search; 1 turns micro-batching off")
    max_wait_ms: float = setting(1.0, "longest a request waits for others to join its batch")
    search_threads: int = setting(
        0, "FAISS (OpenMP) threads; 0 keeps FAISS's default (all cores). 1 is best on a shared, busy CPU"
    )

    def validate(self) -> None:
        super().validate()
        require_index(self.index)
        if self.checksum not in CHECKSUM_MODES:
            raise ValueError(f"checksum must be one of {CHECKSUM_MODES}, got {self.checksum!r}")
        if self.shard < 0:
            raise ValueError(f"shard must be >= 0, got {self.shard}")


@dataclasses.dataclass
class RouterConfig(ServerConfig):
    port: int = setting(ports.RETRIEVER, "gRPC port")
    index: str = setting("", "index directory or its manifest.json: gives the encoder and index facts")
    shards: list[str] = setting(list, "shard addresses host:port, in shard order (comma-separated)", factory=True)
    http_port: int = setting(ports.RETRIEVER_HTTP, "Search-R1-compatible POST /retrieve port; -1 disables it")
    device: str = setting("auto", "encoder device: auto, cpu, cuda")
    max_queries: int = setting(512, "most queries in one call")
    max_query_chars: int = setting(2048, "longest query, in characters")
    max_top_k: int = setting(100, "largest top_k")
    timeout_s: float = setting(10.0, "deadline of a call that brings none (and cap of the caller's)")
    on_shard_failure: str = setting(
        "unavailable",
        "a shard down or late: 'unavailable' fails the call, "
        "'partial' answers from the other shards with the partial flag set",
    )
    max_batch_rows: int = setting(256, "most queries embedded in one encoder batch; 1 turns batching off")
    max_wait_ms: float = setting(2.0, "longest a call waits for others to join its encoder batch")
    shard_wait_s: float = setting(60.0, "at start, how long to wait for shards to answer ShardInfo")
    query_cache_size: int = setting(10000, "query embeddings kept in an LRU cache; 0 turns it off")
    encoder_backend: str = setting(
        "",
        "query encoder backend: empty takes the index's (its manifest); a different one is refused, "
        "since queries must be embedded like the passages were",
    )
    encoder_workers: int = setting(
        2, "encoder batches run in parallel, one thread each (torch and ONNX Runtime release the GIL)"
    )
    encoder_threads: int = setting(
        1,
        "CPU threads per encoder batch; 0 keeps the runtime's default (all cores). On a shared CPU, one "
        "thread per worker avoids OpenMP stalls (one query: 550 ms instead of 15 ms on 2 busy cores)",
    )
    encoder_split_when_idle: bool = setting(
        True,
        "a batch taken while other encoder workers are idle is split among them: a call of 3 queries on "
        "an idle router costs about one query's encoding time instead of three",
    )
    shard_health_interval_s: float = setting(
        2.0, "how often the router checks every shard's health (reported as its own health and metrics)"
    )

    def validate(self) -> None:
        super().validate()
        require_index(self.index)
        if not self.shards:
            raise ValueError("shards is required (--shards host:port,...): the shard addresses in shard order")
        if self.on_shard_failure not in FAILURE_MODES:
            raise ValueError(f"on_shard_failure must be one of {FAILURE_MODES}, got {self.on_shard_failure!r}")
        for name in ("max_queries", "max_query_chars", "max_top_k", "max_batch_rows", "encoder_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
