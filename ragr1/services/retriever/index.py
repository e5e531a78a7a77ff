"""FAISS indexes: the kinds we build, where they run (GPU or CPU, same code), how they are searched.

``flat`` is exact inner product (the papers' setting; 21M x 1024 floats is about 86 GB). ``ivfpq``
compresses vectors to ``pq_m`` bytes each (about 64 bytes a passage) and searches ``nprobe`` lists;
``hnsw`` keeps full vectors but searches a graph (CPU only in FAISS, so it stays on the CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ragr1.services.common.config import Validated, check_at_least, check_choice, setting

INDEX_TYPES = ("flat", "ivfpq", "hnsw")
# What shards serve: the built types, and IVF-flat, which only an import brings.
SERVED_TYPES = (*INDEX_TYPES, "ivfflat")
# Built indexes are inner product; imported ones keep their metric (L2: lower scores are better).
METRICS = ("ip", "l2")
GPU_MODES = ("auto", "never", "always")


@dataclasses.dataclass
class IndexParams(Validated):
    """The index a build makes (``ragr1 index build``'s settings, the stack's and the chart's)."""

    index_types: ClassVar[tuple[str, ...]] = INDEX_TYPES

    index_type: str = setting(
        "flat", f"one of {', '.join(INDEX_TYPES)} (flat: exact inner product; the others compress)"
    )
    # IVF-PQ's lists are capped by the training set's size (new_index).
    nlist: int = setting(4096, "ivfpq: inverted lists")
    pq_m: int = setting(64, "ivfpq: bytes per vector")
    pq_bits: int = setting(8, "ivfpq: bits per code")
    nprobe: int = setting(64, "ivfpq: lists searched")
    hnsw_m: int = setting(32, "hnsw: neighbours per node")
    ef_search: int = setting(128, "hnsw: search beam")

    def validate(self) -> None:
        super().validate()
        check_choice("index_type", self.index_type, self.index_types)
        check_at_least(self, (
            ("nlist", 1), ("pq_m", 1), ("pq_bits", 1), ("nprobe", 1), ("hnsw_m", 2), ("ef_search", 1),
        ))


@dataclasses.dataclass
class IndexSpec(IndexParams):
    """An index as its manifest records it: what was built, or imported with its own metric and type."""

    index_types: ClassVar[tuple[str, ...]] = SERVED_TYPES

    metric: str = "ip"

    def validate(self) -> None:
        super().validate()
        check_choice("metric", self.metric, METRICS)


def use_gpu(mode: str, num_gpus: int) -> bool:
    """Whether to put the index on GPUs: ``auto`` when there are any; ``always`` insists."""
    if mode not in GPU_MODES:
        raise ValueError(f"gpu mode must be one of {GPU_MODES}, got {mode!r}")
    if mode == "always" and num_gpus == 0:
        raise ValueError("gpu mode 'always' but FAISS sees no GPU (is faiss-gpu installed?)")
    return mode != "never" and num_gpus > 0


def gpu_count(faiss: Any) -> int:
    # faiss-cpu builds have no get_num_gpus at all.
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def new_index(faiss: Any, spec: IndexSpec, dim: int, num_vectors: int) -> Any:
    """An empty CPU index of ``spec``'s kind; IVF lists are capped so each gets ~39+ training points."""
    if spec.index_type == "flat":
        return faiss.IndexFlatIP(dim)
    if spec.index_type == "hnsw":
        return faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    if dim % spec.pq_m:
        raise ValueError(f"pq_m={spec.pq_m} must divide the embedding dimension {dim}")
    nlist = max(1, min(spec.nlist, num_vectors // 39))
    return faiss.index_factory(dim, f"IVF{nlist},PQ{spec.pq_m}x{spec.pq_bits}", faiss.METRIC_INNER_PRODUCT)


def _on_device(faiss: Any, index: Any, spec: IndexSpec, gpu: bool) -> Any:
    if gpu and spec.index_type != "hnsw":
        return faiss.index_cpu_to_all_gpus(index)
    return index


def build(faiss: Any, vectors: np.ndarray, spec: IndexSpec, gpu: bool) -> Any:
    """Trains (when the kind needs it) and fills an index on the chosen device; returns a CPU index."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    cpu = new_index(faiss, spec, vectors.shape[1], len(vectors))
    index = _on_device(faiss, cpu, spec, gpu)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    return faiss.index_gpu_to_cpu(index) if index is not cpu else index


def prepare_for_search(faiss: Any, index: Any, spec: IndexSpec, gpu: bool) -> Any:
    """Applies the search-time settings and moves the index to the chosen device."""
    if spec.index_type.startswith("ivf"):
        faiss.extract_index_ivf(index).nprobe = spec.nprobe
    elif spec.index_type == "hnsw":
        index.hnsw.efSearch = spec.ef_search
    return _on_device(faiss, index, spec, gpu)


def mmap_flag(faiss: Any, index_type: str) -> int:
    """The ``read_index`` flag that memory-maps this kind of index instead of reading it whole.

    Flat and HNSW keep their vectors in an ``IndexFlatCodes`` that FAISS can map in place
    (``IO_FLAG_MMAP_IFC``; HNSW's graph is still read); IVF maps its inverted lists (``IO_FLAG_MMAP``).
    Mapped pages are read from disk on first touch and are shared by every process mapping the file.
    """
    if index_type.startswith("ivf"):
        return int(faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    return int(faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)


def set_blas_rows(faiss: Any, rows_per_thread: int, dim: int) -> None:
    """Makes FAISS score a flat search of at least ``rows_per_thread`` query rows per search thread with one
    matrix product (BLAS) instead of one pass over the vectors per row; 0 keeps FAISS's own threshold.

    FAISS compares ``rows x dim`` with ``distance_compute_blas_threshold``, 128,000 since faiss 1.15 (333
    rows of 384 dimensions). Below it, a batch of at least as many rows as threads is searched a row per
    thread, each row reading every vector once: a shard's micro-batch of 96 queries read its vectors 96
    times and cost as much per query as a lone query, so the micro-batch did not batch. (With fewer rows
    than threads FAISS splits the vectors among the threads instead, whatever the threshold.) More threads
    keep up with more rows, hence a threshold per thread, as FAISS's own pending change makes it
    (facebookresearch/faiss#5109). Process-wide: a shard process sets it once, on its index's thread.
    """
    if rows_per_thread > 0:
        faiss.cvar.distance_compute_blas_threshold = rows_per_thread * max(1, faiss.omp_get_max_threads()) * dim


def blas_rows(faiss: Any, dim: int) -> int:
    """The fewest query rows that FAISS scores with one matrix product (its threshold is on rows x dim)."""
    return -(-int(faiss.cvar.distance_compute_blas_threshold) // dim)


def read(faiss: Any, path: str, index_type: str, mmap: bool) -> Any:
    """Opens a shard file on the CPU, memory-mapped or read whole."""
    return faiss.read_index(path, mmap_flag(faiss, index_type) if mmap else 0)
