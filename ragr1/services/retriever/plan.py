"""``ragr1 index plan``: what an index of N passages costs before building it.

For a passage count, an embedding dimension, index types and shard counts it gives the memory of one
shard (CPU and GPU, float32 and float16 vectors), the time to embed the corpus from an encode rate
measured on this machine (scaled by model size to the larger encoders), and what the compressed index
types cost in recall, measured on the shipped corpus against exact search.

Sizes follow FAISS's layouts: Flat stores ``d`` floats a vector; IVF-PQ stores ``pq_m`` bytes of code
and an 8-byte id a vector, plus ``nlist`` centroids; HNSW stores the vector plus its level-0 links
(``2·M`` int32) and about ``M/(M-1)`` of that again on the upper levels. GPU figures add FAISS's
temporary memory (``StandardGpuResources`` keeps up to 1.5 GiB); HNSW has no GPU form in FAISS.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from ragr1.services.retriever.index import IndexSpec

GIB = 1024**3
GPU_SCRATCH_BYTES = int(1.5 * GIB)
# Per model: embedding dimension, transformer layers, hidden size (public model cards). The encode
# cost of a token grows as layers x hidden^2, which scales a rate measured with one model to another.
MODELS: dict[str, tuple[int, int, int]] = {
    "all-MiniLM-L6-v2": (384, 6, 384),
    "intfloat/e5-base-v2": (768, 12, 768),
    "BAAI/bge-large-en-v1.5": (1024, 24, 1024),
}
# Wikipedia in RAG-R1 and Search-R1 (the DPR "wiki-18" split: 100-word passages).
WIKIPEDIA_PASSAGES = 21_015_324


@dataclasses.dataclass(frozen=True)
class ShardMemory:
    cpu_fp32: int
    cpu_fp16: int
    gpu_fp32: int | None  # None: no GPU form
    gpu_fp16: int | None


def shard_memory(passages: int, dim: int, spec: IndexSpec) -> ShardMemory:
    """Bytes one shard of ``passages`` vectors occupies, by where it runs and the vectors' precision."""
    if spec.index_type == "flat":
        fp32, fp16 = passages * dim * 4, passages * dim * 2
        return ShardMemory(fp32, fp16, fp32 + GPU_SCRATCH_BYTES, fp16 + GPU_SCRATCH_BYTES)
    if spec.index_type == "ivfpq":
        nlist = max(1, min(spec.nlist, passages // 39))
        # Codes and ids do not change with the float precision; the centroids are negligible either way.
        size = passages * (spec.pq_m + 8) + nlist * dim * 4 + 256 * dim * 4
        return ShardMemory(size, size, size + GPU_SCRATCH_BYTES, size + GPU_SCRATCH_BYTES)
    links = int(passages * 2 * spec.hnsw_m * 4 * (1 + 1 / (spec.hnsw_m - 1))) + passages * 12
    return ShardMemory(passages * dim * 4 + links, passages * dim * 2 + links, None, None)


def scaled_rate(rate: float, measured_model: str, model: str) -> float:
    """An encode rate (passages/s) measured with ``measured_model``, scaled to ``model`` by compute per token."""
    _, layers0, hidden0 = MODELS[measured_model]
    _, layers, hidden = MODELS[model]
    return rate * (layers0 * hidden0**2) / (layers * hidden**2)


def measure_encode_rate(backend: str, passages: int = 128, words: int = 100) -> float:
    """Passages/s of the shipped MiniLM on this machine (all cores), on shipped passages cut to
    ``words`` words: Wikipedia's 100-word passages are shorter than the shipped paragraphs."""
    from ragr1.services.retriever.corpus import read_corpus
    from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, preset
    from ragr1.shipped import corpus_path

    texts = []
    for record in read_corpus([corpus_path()], limit=passages):
        texts.append(f'"{record.title}"\n' + " ".join(record.text.split()[:words]))
    encoder = Encoder(preset(DEFAULT_ENCODER, backend), device="cpu")
    encoder.encode_passages(texts[:8])  # first call: allocations, lazy initialisation
    started = time.perf_counter()
    encoder.encode_passages(texts)
    return len(texts) / (time.perf_counter() - started)


@dataclasses.dataclass(frozen=True)
class RecallCost:
    index_type: str
    overlap_at_k: float  # share of exact search's top-k that the index finds
    search_ms_per_query: float
    build_vectors_per_s: float


def compressed_recall(
    vectors: np.ndarray, queries: np.ndarray, specs: Sequence[IndexSpec], k: int = 10
) -> list[RecallCost]:
    """Top-k overlap of each index type against exact (flat) search on the same vectors and queries."""
    import faiss

    from ragr1.services.retriever import index as faiss_index

    flat = faiss_index.build(faiss, vectors, IndexSpec("flat"), False)
    started = time.perf_counter()
    _, exact = flat.search(queries, k)
    out = [RecallCost("flat", 1.0, (time.perf_counter() - started) * 1000 / len(queries), float("inf"))]
    for spec in specs:
        started = time.perf_counter()
        built = faiss_index.build(faiss, vectors, spec, False)
        build_rate = len(vectors) / (time.perf_counter() - started)
        searched = faiss_index.prepare_for_search(faiss, built, spec, False)
        started = time.perf_counter()
        _, found = searched.search(queries, k)
        ms = (time.perf_counter() - started) * 1000 / len(queries)
        overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(exact, found, strict=True)]))
        out.append(RecallCost(spec.index_type, overlap, ms, build_rate))
    return out


def human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    return f"{size / GIB:.1f} GiB" if size >= GIB / 10 else f"{size / 1024**2:.0f} MiB"


def human_seconds(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def memory_table(passages: int, dim: int, specs: Sequence[IndexSpec], shard_counts: Sequence[int]) -> list[str]:
    """Markdown rows: index type, shards, passages per shard, memory per shard."""
    lines = [
        "| index | shards | passages/shard | CPU fp32 | CPU fp16 | GPU fp32 | GPU fp16 |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec in specs:
        for shards in shard_counts:
            per = -(-passages // shards)
            m = shard_memory(per, dim, spec)
            cells = [human_bytes(x) for x in (m.cpu_fp32, m.cpu_fp16, m.gpu_fp32, m.gpu_fp16)]
            lines.append(f"| {spec.index_type} | {shards} | {per:,} | " + " | ".join(cells) + " |")
    return lines
