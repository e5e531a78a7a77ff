"""Settings of the retriever's commands: ``corpus ingest``, ``index build`` and ``index plan``, and the
shard and router servers."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import (
    Validated,
    check_at_least,
    check_choice,
    check_required,
    part_of,
    same_as,
    setting,
)
from ragr1.services.common.server import ServerConfig
from ragr1.services.retriever import plan
from ragr1.services.retriever.build import DEFAULT_CHUNK_SIZE
from ragr1.services.retriever.corpus import CORPUS_FORMATS, KILT_WORDS_PER_PASSAGE
from ragr1.services.retriever.encoder import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_ENCODER,
    PRESETS,
    EncoderSettings,
    preset,
)
from ragr1.services.retriever.families import FAMILIES, SEARCH_R1_QUERY_TOKENS
from ragr1.services.retriever.importer import DEFAULT_CHUNK_ROWS
from ragr1.services.retriever.index import GPU_MODES, INDEX_TYPES, IndexParams
from ragr1.services.retriever.router import RouterSettings, SearchLimits
from ragr1.services.retriever.shard import ShardSettings


def require_index(index: str) -> None:
    if not index:
        raise ValueError("index is required (--index): the index directory or its manifest.json")


def _encoder_settings(encoder: str, backend: str, max_passage_tokens: int) -> EncoderSettings:
    """The preset of ``encoder`` on ``backend``, its passage length overridden unless 0."""
    settings = preset(encoder, backend)
    if max_passage_tokens:
        settings = dataclasses.replace(settings, max_passage_tokens=max_passage_tokens)
    return settings


@dataclasses.dataclass
class IngestConfig(Validated):
    """``ragr1 corpus ingest``."""

    input: list[str] = setting(
        list, "JSONL files, .gz allowed, comma-separated; empty: the shipped corpus data/corpus/wiki_passages.jsonl",
        factory=True,
    )
    format: str = setting("jsonl", "jsonl: id + contents or title + text; kilt: KILT pages split into passages")
    words: int = setting(KILT_WORDS_PER_PASSAGE, "words per KILT passage")
    limit: int | None = setting(None, "stop after this many passages")
    out: str = setting("", "store directory (required)")

    def validate(self) -> None:
        super().validate()
        check_choice("format", self.format, CORPUS_FORMATS)
        check_at_least(self, (("words", 1),))
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if not self.out:
            raise ValueError("out is required: the directory the passage store is written to")


@dataclasses.dataclass
class BuildConfig(IndexParams):
    """``ragr1 index build``."""

    store: str = setting("", "passage store from `ragr1 corpus ingest` (required)")
    out: str = setting("", "index directory (required)")
    num_shards: int = setting(1, "how many shard files the index is split into")
    encoder: str = setting(DEFAULT_ENCODER, f"preset ({', '.join(PRESETS)}), a hub id or a model directory")
    max_passage_tokens: int = setting(0, "override the preset's passage length; 0 keeps it")
    encoder_backend: str = setting(
        DEFAULT_BACKEND,
        "torch (float32; float16 on GPUs), onnx (ONNX Runtime, float32) or onnx-int8 (int8 weights); "
        "the export is kept beside the index and the router uses it",
    )
    gpu: str = setting("auto", f"build on GPUs when FAISS sees them: {', '.join(GPU_MODES)}")
    embeddings_dir: str = setting("", "embedding chunks; empty: RAGR1_CACHE_DIR/embeddings/<store>-<encoder>")
    chunk_size: int = setting(DEFAULT_CHUNK_SIZE, "passages per saved chunk")

    def validate(self) -> None:
        super().validate()
        check_required(self, (("store", "the passage store from `ragr1 corpus ingest`"),
                              ("out", "the directory the index is written to")))
        check_choice("encoder_backend", self.encoder_backend, BACKENDS)
        check_choice("gpu", self.gpu, GPU_MODES)
        check_at_least(self, (("num_shards", 1), ("max_passage_tokens", 0), ("chunk_size", 1)))

    def encoder_settings(self) -> EncoderSettings:
        return _encoder_settings(self.encoder, self.encoder_backend, self.max_passage_tokens)


@dataclasses.dataclass
class ImportConfig(Validated):
    """``ragr1 index import``."""

    input: list[str] = setting(
        list, "FAISS index file(s), flat (IP or L2), HNSW-flat, IVF-flat or IVF-PQ; several: parts whose rows "
        "continue in order (comma-separated)", factory=True,
    )
    corpus: list[str] = setting(
        list, "corpus files whose line i is row i of the index (Search-R1's wiki-18.jsonl; comma-separated)",
        factory=True,
    )
    corpus_format: str = same_as(IngestConfig, "format")
    words: int = same_as(IngestConfig, "words")
    store: str = setting("", "an existing passage store instead of --corpus")
    out: str = setting("", "index directory (required)")
    num_shards: int = same_as(BuildConfig, "num_shards")
    encoder: str = setting("", "the model the index was built with, e.g. intfloat/e5-base-v2 (required)")
    encoder_family: str = setting(
        "auto", f"how queries are encoded: {', '.join(FAMILIES)} (auto: from the name, as Search-R1 does)"
    )
    pooling: str = setting("", "override the family's pooling: mean or cls; empty keeps it")
    max_query_tokens: int = setting(SEARCH_R1_QUERY_TOKENS, "longest query in tokens (Search-R1's server: 256)")
    encoder_backend: str = setting(
        "torch", "torch (float32, as their server), onnx or onnx-int8 (an export kept beside the index)"
    )
    ef_search: int = setting(0, "hnsw: search beam of the shards; 0 keeps the source index's")
    nprobe: int = setting(0, "ivf: lists searched by the shards; 0 keeps the source index's")
    chunk_rows: int = setting(DEFAULT_CHUNK_ROWS, "vectors copied per read: the memory an import of a flat index needs")

    def validate(self) -> None:
        super().validate()
        check_required(self, (("input", "the FAISS index file(s)"),))
        if bool(self.corpus) == bool(self.store):
            raise ValueError("give exactly one of corpus (JSONL or KILT files) and store (a passage store)")
        check_required(self, (("out", "the directory the index is written to"),
                              ("encoder", "the model the index was built with (e.g. intfloat/e5-base-v2)")))
        check_choice("corpus_format", self.corpus_format, CORPUS_FORMATS)
        check_choice("encoder_family", self.encoder_family, FAMILIES)
        if self.pooling:
            check_choice("pooling", self.pooling, ("mean", "cls"))
        check_choice("encoder_backend", self.encoder_backend, BACKENDS)
        check_at_least(self, (
            ("words", 1), ("num_shards", 1), ("max_query_tokens", 1), ("ef_search", 0), ("nprobe", 0),
            ("chunk_rows", 1),
        ))

    def encoder_settings(self) -> EncoderSettings:
        from ragr1.services.retriever.families import family_settings

        return family_settings(
            self.encoder, self.encoder_family, pooling=self.pooling, max_query_tokens=self.max_query_tokens,
            backend=self.encoder_backend,
        )


@dataclasses.dataclass
class PlanConfig(Validated):
    """``ragr1 index plan``."""

    passages: int = setting(plan.WIKIPEDIA_PASSAGES, "passage count (default: Wikipedia's wiki-18)")
    encoder: str = setting("BAAI/bge-large-en-v1.5", f"model, which gives the dimension: {', '.join(plan.MODELS)}")
    index_type: list[str] = setting(lambda: list(INDEX_TYPES), "index types, comma-separated", factory=True)
    shard_counts: list[int] = setting(lambda: [1, 4, 8], "shard counts to size, comma-separated", factory=True)
    pq_m: int = same_as(BuildConfig, "pq_m")
    # Wikipedia's size (the default passages) wants more lists than a build's default.
    nlist: int = setting(65536, "ivfpq: inverted lists of the sized index")
    hnsw_m: int = same_as(BuildConfig, "hnsw_m")
    encode_rate: float = setting(0.0, "passages/s (e.g. of your GPUs); 0 measures a rate here")
    measure_backend: str = setting(DEFAULT_BACKEND, f"encoder backend measured here: {', '.join(BACKENDS)}")
    store: str = setting("", "passage store to measure recall on; empty: recall is not measured")
    queries: int = setting(500, "questions to measure recall with")
    max_passage_tokens: int = same_as(BuildConfig, "max_passage_tokens")
    k: int = setting(10, "top-k compared")
    recall_pq_m: int = setting(
        48, f"ivfpq bytes per vector when measuring recall (must divide {DEFAULT_ENCODER}'s dimension)"
    )

    def validate(self) -> None:
        super().validate()
        check_choice("encoder", self.encoder, tuple(plan.MODELS))
        check_choice("measure_backend", self.measure_backend, BACKENDS)
        for kind in self.index_type:
            check_choice("index_type", kind, INDEX_TYPES)
        if not self.index_type:
            raise ValueError("index_type must name at least one index type")
        if not self.shard_counts or min(self.shard_counts) < 1:
            raise ValueError(f"shard_counts must list positive counts, got {self.shard_counts}")
        check_at_least(self, (
            ("passages", 1), ("pq_m", 1), ("nlist", 1), ("hnsw_m", 2), ("queries", 1), ("max_passage_tokens", 0),
            ("k", 1), ("recall_pq_m", 1),
        ))
        if self.encode_rate < 0:
            raise ValueError(f"encode_rate must be 0 (measure here) or positive, got {self.encode_rate}")
        dim = plan.MODELS[DEFAULT_ENCODER][0]
        if dim % self.recall_pq_m:
            raise ValueError(
                f"recall_pq_m must divide {dim}, the dimension of {DEFAULT_ENCODER}, got {self.recall_pq_m}"
            )

    def encoder_settings(self) -> EncoderSettings:
        """What ``--store`` is embedded with to measure recall: the shipped encoder, on the measured backend."""
        return _encoder_settings(DEFAULT_ENCODER, self.measure_backend, self.max_passage_tokens)


@dataclasses.dataclass
class ShardConfig(ServerConfig):
    port: int = setting(ports.RETRIEVER_SHARD, "gRPC port (shard i conventionally on RETRIEVER_SHARD + i)")
    index: str = setting("", "index directory or its manifest.json (from `ragr1 index build`)")
    shard: int = setting(0, "which shard of the index to serve, 0-based")
    gpu: str = same_as(ShardSettings, "gpu")
    checksum: str = same_as(ShardSettings, "checksum")
    mmap: bool = same_as(ShardSettings, "mmap")
    max_batch_rows: int = same_as(ShardSettings, "max_batch_rows")
    max_wait_ms: float = same_as(ShardSettings, "max_wait_ms")
    search_threads: int = same_as(ShardSettings, "search_threads")
    blas_rows_per_thread: int = same_as(ShardSettings, "blas_rows_per_thread")
    blocked_scan: bool = same_as(ShardSettings, "blocked_scan")

    def validate(self) -> None:
        super().validate()
        require_index(self.index)
        check_at_least(self, [("shard", 0)])
        self.shard_settings()

    def shard_settings(self) -> ShardSettings:
        return part_of(ShardSettings, self)


@dataclasses.dataclass
class RouterConfig(SearchLimits, ServerConfig):
    port: int = setting(ports.RETRIEVER, "gRPC port")
    # The router reads the manifest: the encoder, the shards' facts.
    index: str = same_as(ShardConfig, "index")
    shards: list[str] = setting(
        list, "shard addresses host:port, in shard order (comma-separated); or one address holding {shard}, "
        "filled in with every shard number of the index (retriever-shard-{shard}:50061)", factory=True,
    )
    http_port: int = setting(ports.RETRIEVER_HTTP, "Search-R1-compatible POST /retrieve port; -1 disables it")
    device: str = setting("auto", "encoder device: auto, cpu, cuda")
    timeout_s: float = same_as(RouterSettings, "timeout_s")
    on_shard_failure: str = same_as(RouterSettings, "on_shard_failure")
    max_batch_rows: int = same_as(RouterSettings, "max_batch_rows")
    max_wait_ms: float = same_as(RouterSettings, "max_wait_ms")
    shard_wait_s: float = setting(60.0, "at start, how long to wait for shards to answer ShardInfo")
    query_cache_size: int = same_as(RouterSettings, "query_cache_size")
    encoder_backend: str = setting(
        "",
        "query encoder backend: empty takes the index's (its manifest); a different one is refused, "
        "since queries must be embedded like the passages were",
    )
    encoder_workers: int = same_as(RouterSettings, "encoder_workers")
    encoder_threads: int = setting(
        1,
        "CPU threads per encoder batch; 0 keeps the runtime's default (all cores). On a shared CPU, one "
        "thread per worker avoids OpenMP stalls (threads spinning while others hold the cores)",
    )
    encoder_split_when_idle: bool = same_as(RouterSettings, "encoder_split_when_idle")
    shard_health_interval_s: float = setting(
        2.0, "how often the router checks every shard's health (reported as its own health and metrics)"
    )

    def validate(self) -> None:
        super().validate()
        require_index(self.index)
        if not self.shards:
            raise ValueError("shards is required (--shards host:port,...): the shard addresses in shard order")
        if len(self.shards) > 1 and any("{shard}" in s for s in self.shards):
            raise ValueError("shards: a list of addresses, or one address holding {shard}, not both")
        self.router_settings()

    def router_settings(self) -> RouterSettings:
        return part_of(RouterSettings, self)

    def shard_addresses(self, num_shards: int) -> list[str]:
        """The shards' addresses for an index of ``num_shards`` shards, so that a deployment names its shard
        count once (docker-compose.yml: the index build's)."""
        if len(self.shards) == 1 and "{shard}" in self.shards[0]:
            return [self.shards[0].replace("{shard}", str(i)) for i in range(num_shards)]
        return list(self.shards)
