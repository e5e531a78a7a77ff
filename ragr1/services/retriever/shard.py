"""One shard: a FAISS index over a slice of the passages, searched by one thread in micro-batches.

The index file is memory-mapped by default: opening it reads the header (and HNSW's graph), not the
vectors, so a shard of a 21M-passage index is ready in seconds and its pages come from disk (or the
page cache that other shards of the same file share) as searches touch them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever import metrics
from ragr1.services.retriever.batching import Batching, MicroBatcher
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.services.retriever.results import Hit

log = logging.getLogger(__name__)

# One request to the index: query rows and the k it wants.
ShardQuery = tuple[np.ndarray, int]
ShardAnswer = tuple[np.ndarray, np.ndarray]  # scores, global rows; k columns each


class ShardSearcher:
    """Loads and checks shard ``shard`` of the index at ``manifest``; ``search`` is safe to call concurrently.

    Raises ``ManifestMismatch`` (with the reason) when the files do not match the manifest.
    """

    def __init__(
        self,
        manifest: LoadedManifest,
        shard: int,
        *,
        gpu: str = "auto",
        verify_checksum: bool = True,
        max_batch_rows: int = 256,
        max_wait_s: float = 0.001,
        mmap: bool = True,
    ) -> None:
        import faiss

        self.manifest = manifest
        self.shard = shard
        self.entry = manifest.entry(shard)
        manifest.check_shard_file(shard, verify_checksum=verify_checksum)
        self.store = PassageStore(manifest.store_path())
        manifest.check_store(self.store)
        spec = manifest.manifest.index
        cpu_index = faiss_index.read(faiss, str(manifest.shard_path(shard)), spec.index_type, mmap)
        manifest.check_shard_index(shard, cpu_index.ntotal, cpu_index.d)
        self.mmap = mmap
        self.dim = int(cpu_index.d)
        self.on_gpu = faiss_index.use_gpu(gpu, faiss_index.gpu_count(faiss))
        # One worker: a (GPU) FAISS index must not be used from two threads.
        batching = Batching(max_batch_rows=max_batch_rows, max_wait_s=max_wait_s, workers=1, split_when_idle=False)
        self._batcher: MicroBatcher[ShardQuery, ShardAnswer] = MicroBatcher(
            self._search_batch, batching, name=f"shard{shard}", on_batch=metrics.batch_observer("shard"),
        )
        # The index is created on, and afterwards only touched by, the batcher's thread.
        self._index: Any = self._batcher.run_sync(
            lambda: faiss_index.prepare_for_search(faiss, cpu_index, manifest.manifest.index, self.on_gpu)
        ).result()
        self.search_threads = self._batcher.run_sync(lambda: int(faiss.omp_get_max_threads())).result()
        log.info(
            "shard %d: %d passages (rows %d..%d), %s index on %s%s",
            shard,
            self.num_passages,
            self.entry.start,
            self.entry.end,
            spec.index_type,
            "GPU" if self.on_gpu else "CPU",
            ", memory-mapped" if mmap and not self.on_gpu else "",
        )

    def set_threads(self, threads: int, blas_rows_per_thread: int) -> None:
        """FAISS's threads for this shard's searches (0: every core) and the batch size from which they are
        one matrix product (``index.set_blas_rows``), set on the thread that runs the searches: OpenMP keeps
        a thread count per thread, and one set on another thread leaves the searches on every core."""
        import faiss

        def apply() -> int:
            if threads > 0:
                faiss.omp_set_num_threads(threads)
            faiss_index.set_blas_rows(faiss, blas_rows_per_thread, self.dim)
            return int(faiss.omp_get_max_threads())

        self.search_threads = self._batcher.run_sync(apply).result()
        log.info("shard %d: %d search thread(s)", self.shard, self.search_threads)

    @property
    def num_passages(self) -> int:
        return self.entry.end - self.entry.start

    def _search_batch(self, requests: Sequence[ShardQuery]) -> list[ShardAnswer]:
        k = min(max(top_k for _, top_k in requests), self.num_passages)
        queries = np.concatenate([q for q, _ in requests]) if len(requests) > 1 else requests[0][0]
        with metrics.SHARD_SEARCH_SECONDS.time():
            scores, rows = self._index.search(queries, k)
        out = []
        first = 0
        for q, top_k in requests:
            last = first + len(q)
            out.append((scores[first:last, :top_k], rows[first:last, :top_k]))
            first = last
        return out

    async def search(self, embeddings: np.ndarray, top_k: int, omit_text: bool = False) -> list[list[Hit]]:
        """Best-first hits per query row; ``top_k`` above the shard size returns the whole shard."""
        if embeddings.ndim != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"embeddings must be n x {self.dim}, got shape {embeddings.shape}")
        if top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        scores, rows = await self._batcher.submit((embeddings, top_k), rows=len(embeddings))
        return [
            [self._hit(int(row), float(score), omit_text) for score, row in zip(s, r, strict=True) if row >= 0]
            for s, r in zip(scores, rows, strict=True)
        ]

    def _hit(self, local_row: int, score: float, omit_text: bool) -> Hit:
        passage = self.store[self.entry.start + local_row]
        return Hit(passage.id, passage.title, "" if omit_text else passage.text, score, self.shard)

    async def aclose(self) -> None:
        await self._batcher.aclose()
        self.store.close()
