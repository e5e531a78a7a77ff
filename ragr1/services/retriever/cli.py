"""The retriever's commands: ``ragr1 corpus ingest``, ``ragr1 index build``,
``ragr1 serve retriever-shard`` and ``ragr1 serve retriever``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ragr1.services.common.commands import service
from ragr1.services.retriever.config import RouterConfig, ShardConfig


def _ingest(args: argparse.Namespace) -> int:
    from ragr1.data import corpus_path
    from ragr1.services.retriever.corpus import read_corpus, write_store

    inputs = args.input or [corpus_path()]
    store = write_store(read_corpus(inputs, args.format, args.words, args.limit), args.out)
    print(f"{len(store)} passages in {store.directory} (sha256 {store.sha256[:12]})")
    return 0


def _build(args: argparse.Namespace) -> int:
    from ragr1.services.retriever.build import build_index
    from ragr1.services.retriever.corpus import PassageStore
    from ragr1.services.retriever.encoder import preset
    from ragr1.services.retriever.index import IndexSpec

    settings = preset(args.encoder, args.encoder_backend)
    if args.max_passage_tokens:
        settings = dataclasses.replace(settings, max_passage_tokens=args.max_passage_tokens)
    spec = IndexSpec(
        args.index_type,
        nlist=args.nlist,
        pq_m=args.pq_m,
        pq_bits=args.pq_bits,
        nprobe=args.nprobe,
        hnsw_m=args.hnsw_m,
        ef_search=args.ef_search,
    )
    path = build_index(
        PassageStore(args.store),
        settings,
        args.out,
        num_shards=args.shards,
        spec=spec,
        gpu=args.gpu,
        embeddings_dir=args.embeddings_dir,
        chunk_size=args.chunk_size,
    )
    print(f"index written; manifest {path}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from ragr1.services.retriever import plan
    from ragr1.services.retriever.index import IndexSpec

    if args.encoder not in plan.MODELS:
        raise ValueError(f"--encoder must be one of {', '.join(plan.MODELS)} (their sizes are known)")
    if args.passages <= 0:
        raise ValueError(f"--passages must be positive, got {args.passages}")
    dim = plan.MODELS[args.encoder][0]
    shard_counts = [int(x) for x in args.shards.split(",")]
    if any(n <= 0 for n in shard_counts):
        raise ValueError(f"--shards must list positive counts, got {args.shards!r}")
    kinds = args.index_type.split(",")
    specs = [IndexSpec(t, pq_m=args.pq_m, nlist=args.nlist, hnsw_m=args.hnsw_m) for t in kinds]
    print(f"{args.passages:,} passages, {args.encoder} ({dim}-d)\n")
    print("\n".join(plan.memory_table(args.passages, dim, specs, shard_counts)))
    if args.encode_rate:
        rate, source = args.encode_rate, "given with --encode-rate"
    else:
        measured = plan.measure_encode_rate(args.measure_backend)
        rate = plan.scaled_rate(measured, "all-MiniLM-L6-v2", args.encoder)
        source = (
            f"all-MiniLM-L6-v2 ({args.measure_backend}) measured here at {measured:.0f} passages/s "
            f"on 100-word passages, scaled by compute per token"
        )
    print(f"\nembedding: {rate:,.1f} passages/s ({source}): {plan.human_seconds(args.passages / rate)}")
    if args.store is None:
        print("recall of the compressed types: pass --store (e.g. of the shipped corpus) to measure it")
        return 0
    from ragr1.data import all_questions
    from ragr1.services.retriever.build import embed_store, embeddings_cache_dir
    from ragr1.services.retriever.corpus import PassageStore
    from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, preset

    store = PassageStore(args.store)
    settings = preset(DEFAULT_ENCODER, args.measure_backend)
    if args.max_passage_tokens:
        settings = dataclasses.replace(settings, max_passage_tokens=args.max_passage_tokens)
    vectors = embed_store(store, settings, embeddings_cache_dir(store, settings)).rows(0, len(store))
    queries = Encoder(settings, device="cpu").encode_queries(all_questions()[: args.queries])
    compressed = [IndexSpec(t, pq_m=args.recall_pq_m, hnsw_m=args.hnsw_m) for t in kinds if t != "flat"]
    print(f"\nmeasured on {len(store):,} passages of {store.directory}, {len(queries)} questions, k={args.k}:")
    for cost in plan.compressed_recall(vectors, queries, compressed, args.k):
        build = "" if cost.index_type == "flat" else f", built at {cost.build_vectors_per_s:,.0f} vectors/s"
        print(
            f"  {cost.index_type:<6} top-{args.k} overlap with flat {cost.overlap_at_k:.3f}, "
            f"{cost.search_ms_per_query:.3f} ms/query{build}"
        )
    return 0


def register(commands: Any, serve: Any) -> None:
    from ragr1.services.retriever.build import DEFAULT_CHUNK_SIZE
    from ragr1.services.retriever.corpus import CORPUS_FORMATS, KILT_WORDS_PER_PASSAGE
    from ragr1.services.retriever.encoder import BACKENDS, DEFAULT_BACKEND, DEFAULT_ENCODER, PRESETS
    from ragr1.services.retriever.index import GPU_MODES, INDEX_TYPES, IndexSpec

    corpus = commands.add_parser("corpus", help="turn a corpus into a passage store").add_subparsers(
        dest="corpus_command", required=True, metavar="ACTION"
    )
    ingest = corpus.add_parser("ingest", help="JSONL (DPR/FlashRAG) or KILT pages -> passage store")
    ingest.add_argument(
        "--input",
        type=Path,
        nargs="*",
        help="JSONL files, .gz allowed [default: the shipped corpus data/corpus/wiki_passages.jsonl]",
    )
    ingest.add_argument(
        "--format",
        choices=CORPUS_FORMATS,
        default="jsonl",
        help="jsonl: id + contents or title + text; kilt: KILT pages split into passages",
    )
    ingest.add_argument("--words", type=int, default=KILT_WORDS_PER_PASSAGE, help="words per KILT passage")
    ingest.add_argument("--limit", type=int, default=None, help="stop after this many passages")
    ingest.add_argument("--out", type=Path, required=True, help="store directory")
    ingest.set_defaults(run=_ingest)

    index = commands.add_parser("index", help="build FAISS indexes").add_subparsers(
        dest="index_command", required=True, metavar="ACTION"
    )
    build = index.add_parser("build", help="embed a passage store (resumable) and build N shards + manifest")
    defaults = IndexSpec()
    build.add_argument("--store", type=Path, required=True, help="passage store from `ragr1 corpus ingest`")
    build.add_argument("--out", type=Path, required=True, help="index directory")
    build.add_argument("--shards", type=int, default=1, help="number of shards")
    build.add_argument("--index-type", choices=INDEX_TYPES, default=defaults.index_type)
    build.add_argument(
        "--encoder",
        default=DEFAULT_ENCODER,
        help=f"preset ({', '.join(PRESETS)}) or a model directory [default: {DEFAULT_ENCODER}]",
    )
    build.add_argument("--max-passage-tokens", type=int, default=0, help="override the preset's passage length")
    build.add_argument(
        "--encoder-backend",
        choices=BACKENDS,
        default=DEFAULT_BACKEND,
        help="torch (float32; float16 on GPUs), onnx (ONNX Runtime, float32) or onnx-int8 (int8 weights); "
        "the export is kept beside the index and the router uses it",
    )
    build.add_argument("--gpu", choices=GPU_MODES, default="auto", help="build on GPUs when FAISS sees them")
    build.add_argument(
        "--embeddings-dir",
        type=Path,
        default=None,
        help="embedding chunks [default: RAGR1_CACHE_DIR/embeddings/<store>-<encoder>]",
    )
    build.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="passages per saved chunk")
    build.add_argument("--nlist", type=int, default=defaults.nlist, help="ivfpq: inverted lists")
    build.add_argument("--pq-m", type=int, default=defaults.pq_m, help="ivfpq: bytes per vector")
    build.add_argument("--pq-bits", type=int, default=defaults.pq_bits, help="ivfpq: bits per code")
    build.add_argument("--nprobe", type=int, default=defaults.nprobe, help="ivfpq: lists searched")
    build.add_argument("--hnsw-m", type=int, default=defaults.hnsw_m, help="hnsw: neighbours per node")
    build.add_argument("--ef-search", type=int, default=defaults.ef_search, help="hnsw: search beam")
    build.set_defaults(run=_build)

    planner = index.add_parser(
        "plan", help="memory per shard, embedding time and recall cost of an index, before building it"
    )
    planner.add_argument("--passages", type=int, default=21_015_324, help="passage count [Wikipedia: 21,015,324]")
    planner.add_argument("--encoder", default="BAAI/bge-large-en-v1.5", help="model (gives the dimension)")
    planner.add_argument("--index-type", default=",".join(INDEX_TYPES), help="comma-separated index types")
    planner.add_argument("--shards", default="1,4,8", help="comma-separated shard counts")
    planner.add_argument("--pq-m", type=int, default=defaults.pq_m, help="ivfpq: bytes per vector")
    planner.add_argument("--nlist", type=int, default=65536, help="ivfpq: inverted lists")
    planner.add_argument("--hnsw-m", type=int, default=defaults.hnsw_m, help="hnsw: neighbours per node")
    planner.add_argument("--encode-rate", type=float, default=0.0, help="passages/s (e.g. of your GPUs)")
    planner.add_argument("--measure-backend", choices=BACKENDS, default=DEFAULT_BACKEND, help="backend measured here")
    planner.add_argument("--store", type=Path, default=None, help="passage store to measure recall on")
    planner.add_argument("--queries", type=int, default=500, help="questions to measure recall with")
    planner.add_argument(
        "--max-passage-tokens", type=int, default=0, help="passage length when embedding --store (0: preset's)"
    )
    planner.add_argument("--k", type=int, default=10, help="top-k compared")
    planner.add_argument(
        "--recall-pq-m", type=int, default=48, help="ivfpq bytes per vector when measuring (must divide 384)"
    )
    planner.set_defaults(run=_plan)

    server = "ragr1.services.retriever.server"
    service(serve, "retriever-shard", ShardConfig, server, help="serve one shard of a FAISS index")
    service(serve, "retriever", RouterConfig, server, help="the retriever router (gRPC + Search-R1 HTTP endpoint)")
