"""The retriever's commands: ``ragr1 corpus ingest``, ``ragr1 index build``, ``ragr1 index import``,
``ragr1 index plan``,
``ragr1 serve retriever-shard`` and ``ragr1 serve retriever``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ragr1.services.common.commands import command, service
from ragr1.services.common.config import part_of
from ragr1.services.retriever.config import (
    BuildConfig,
    ImportConfig,
    IngestConfig,
    PlanConfig,
    RouterConfig,
    ShardConfig,
)


def _ingest(config: IngestConfig) -> int:
    from ragr1.services.retriever.corpus import read_corpus, write_store
    from ragr1.shipped import corpus_path

    inputs = [Path(p) for p in config.input] or [corpus_path()]
    passages = read_corpus(inputs, config.format, config.words, config.limit)
    # A progress bar is for a terminal; in a log or a pipe it is noise around the one line an error prints.
    store = write_store(passages, Path(config.out), progress=sys.stderr.isatty())
    print(f"{len(store)} passages in {store.directory} (sha256 {store.sha256[:12]})")
    return 0


def _build(config: BuildConfig) -> int:
    from ragr1.services.retriever.build import build_index
    from ragr1.services.retriever.corpus import PassageStore
    from ragr1.services.retriever.index import IndexParams, IndexSpec

    path = build_index(
        PassageStore(Path(config.store)),
        config.encoder_settings(),
        Path(config.out),
        num_shards=config.num_shards,
        spec=part_of(IndexSpec, config, IndexParams),
        gpu=config.gpu,
        embeddings_dir=Path(config.embeddings_dir) if config.embeddings_dir else None,
        chunk_size=config.chunk_size,
    )
    print(f"index written; manifest {path}")
    return 0


def _import(config: ImportConfig) -> int:
    from ragr1.services.retriever.corpus import PassageStore
    from ragr1.services.retriever.importer import import_index

    path = import_index(
        [Path(p) for p in config.input],
        Path(config.out),
        config.encoder_settings(),
        num_shards=config.num_shards,
        store=PassageStore(Path(config.store)) if config.store else None,
        corpus=[Path(p) for p in config.corpus],
        corpus_format=config.corpus_format,
        words=config.words,
        chunk_rows=config.chunk_rows,
        ef_search=config.ef_search,
        nprobe=config.nprobe,
        progress=sys.stderr.isatty(),
    )
    print(f"index imported; manifest {path}")
    return 0


def _plan(config: PlanConfig) -> int:
    from ragr1.services.retriever import plan
    from ragr1.services.retriever.index import IndexSpec

    dim = plan.MODELS[config.encoder][0]
    specs = [IndexSpec(t, pq_m=config.pq_m, nlist=config.nlist, hnsw_m=config.hnsw_m) for t in config.index_type]
    print(f"{config.passages:,} passages, {config.encoder} ({dim}-d)\n")
    print("\n".join(plan.memory_table(config.passages, dim, specs, config.shard_counts)))
    if config.encode_rate:
        rate, source = config.encode_rate, "given with --encode-rate"
    else:
        measured = plan.measure_encode_rate(config.measure_backend)
        rate = plan.scaled_rate(measured, "all-MiniLM-L6-v2", config.encoder)
        source = (
            f"all-MiniLM-L6-v2 ({config.measure_backend}) measured here at {measured:.0f} passages/s "
            f"on 100-word passages, scaled by compute per token"
        )
    print(f"\nembedding: {rate:,.1f} passages/s ({source}): {plan.human_seconds(config.passages / rate)}")
    if not config.store:
        print("recall of the compressed types: pass --store (e.g. of the shipped corpus) to measure it")
        return 0
    from ragr1.services.retriever.build import embed_store, embeddings_cache_dir
    from ragr1.services.retriever.corpus import PassageStore
    from ragr1.services.retriever.encoder import Encoder
    from ragr1.shipped import all_questions

    store = PassageStore(Path(config.store))
    settings = config.encoder_settings()
    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings)).rows(0, len(store))
    queries = Encoder(settings, device="cpu").encode_queries(all_questions()[: config.queries])
    compressed = [
        IndexSpec(t, pq_m=config.recall_pq_m, hnsw_m=config.hnsw_m) for t in config.index_type if t != "flat"
    ]
    print(f"\nmeasured on {len(store):,} passages of {store.directory}, {len(queries)} questions, k={config.k}:")
    for cost in plan.compressed_recall(vectors, queries, compressed, config.k):
        build = "" if cost.index_type == "flat" else f", built at {cost.build_vectors_per_s:,.0f} vectors/s"
        print(
            f"  {cost.index_type:<6} top-{config.k} overlap with flat {cost.overlap_at_k:.3f}, "
            f"{cost.search_ms_per_query:.3f} ms/query{build}"
        )
    return 0


def register(commands: Any, serve: Any) -> None:
    corpus = commands.add_parser("corpus", help="turn a corpus into a passage store").add_subparsers(
        dest="corpus_command", required=True, metavar="ACTION"
    )
    command(
        corpus, "ingest", IngestConfig, _ingest, help="JSONL (DPR/FlashRAG) or KILT pages -> passage store"
    )

    index = commands.add_parser("index", help="build FAISS indexes").add_subparsers(
        dest="index_command", required=True, metavar="ACTION"
    )
    command(
        index, "build", BuildConfig, _build,
        help="embed a passage store (resumable) and build N shards + manifest",
    )
    command(
        index, "import", ImportConfig, _import,
        help="an existing FAISS index (Search-R1, RAG-R1) + its corpus -> N shards + manifest, no embedding",
    )
    command(
        index, "plan", PlanConfig, _plan,
        help="memory per shard, embedding time and recall cost of an index, before building it",
    )

    server = "ragr1.services.retriever.server"
    service(serve, "retriever-shard", ShardConfig, server, help="serve one shard of a FAISS index")
    service(serve, "retriever", RouterConfig, server, help="the retriever router (gRPC + Search-R1 HTTP endpoint)")
