"""One shard: a FAISS index over a slice of the passages, searched by one thread in micro-batches.

The index file is memory-mapped by default: opening it reads the header (and HNSW's graph), not the
vectors, so a shard of a 21M-passage index is ready in seconds and its pages come from disk (or the
page cache that other shards of the same file share) as searches touch them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragr1.services.common.config import Validated, check_at_least, check_choice, setting
from ragr1.services.retriever import index as faiss_index
from ragr1.services.retriever import metrics
from ragr1.services.retriever.batching import Batching, MicroBatcher
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.services.retriever.results import Hit

if TYPE_CHECKING:
    from ragr1.services.retriever.scan import FlatScan

log = logging.getLogger(__name__)

# One request to the index: query rows and the k it wants.
ShardQuery = tuple[np.ndarray, int]
ShardAnswer = tuple[np.ndarray, np.ndarray]  # scores, global rows; k columns each

# When a shard's file is checked against the manifest's SHA-256 (ShardSettings.checksum).
CHECKSUM_MODES = ("start", "background", "off")


@dataclasses.dataclass
class ShardSettings(Validated):
    """How a shard opens and searches its index. The shard's config takes each of these definitions (``same_as``)
    and gives the searcher this object whole (``ShardConfig.shard_settings``)."""

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
        1,
        "FAISS (OpenMP) threads of the shard's searches; 0: every core. More only where the shard has cores of "
        "its own: on a shared or CPU-limited host every parallel region waits for threads that are not running",
    )
    blas_rows_per_thread: int = setting(
        12,
        "flat indexes: a micro-batch of at least this many query rows per search thread is scored with one "
        "matrix product (BLAS), fewer as blocked_scan says; 0 keeps FAISS's own threshold",
    )
    blocked_scan: bool = setting(
        True,
        "flat indexes on the CPU: a micro-batch of 2 or more query rows below the matrix-product threshold is "
        "scored in one pass over the vectors for all its rows; off: FAISS's pass over the vectors per row",
    )

    def validate(self) -> None:
        super().validate()
        check_choice("gpu", self.gpu, faiss_index.GPU_MODES)
        check_choice("checksum", self.checksum, CHECKSUM_MODES)
        check_at_least(self, (("max_batch_rows", 1), ("max_wait_ms", 0), ("search_threads", 0),
                              ("blas_rows_per_thread", 0)))

    def search_batching(self) -> Batching:
        # One worker: a (GPU) FAISS index must not be used from two threads.
        return Batching(max_batch_rows=self.max_batch_rows, max_wait_s=self.max_wait_ms / 1000, workers=1,
                        split_when_idle=False)


class ShardSearcher:
    """Loads and checks shard ``shard`` of the index at ``manifest``; ``search`` is safe to call concurrently.

    Raises ``ManifestMismatch`` (with the reason) when the files do not match the manifest.
    """

    def __init__(self, manifest: LoadedManifest, shard: int, settings: ShardSettings) -> None:
        import faiss

        self.manifest = manifest
        self.shard = shard
        self.settings = settings
        self.entry = manifest.entry(shard)
        # "background" is the server's: it checks the file beside serving.
        manifest.check_shard_file(shard, verify_checksum=settings.checksum == "start")
        self.store = PassageStore(manifest.store_path())
        manifest.check_store(self.store)
        spec = manifest.manifest.index
        cpu_index = faiss_index.read(faiss, str(manifest.shard_path(shard)), spec.index_type, settings.mmap)
        manifest.check_shard_index(shard, cpu_index.ntotal, cpu_index.d)
        self.dim = int(cpu_index.d)
        self.on_gpu = faiss_index.use_gpu(settings.gpu, faiss_index.gpu_count(faiss))
        self._batcher: MicroBatcher[ShardQuery, ShardAnswer] = MicroBatcher(
            self._search_batch, settings.search_batching(), name=f"shard{shard}",
            on_batch=metrics.batch_observer("shard"),
        )
        # The index is created on, and afterwards only touched by, the batcher's thread.
        self._index: Any = self._batcher.run_sync(
            lambda: faiss_index.prepare_for_search(faiss, cpu_index, manifest.manifest.index, self.on_gpu)
        ).result()
        log.info(
            "shard %d: %d passages (rows %d..%d), %s index on %s%s",
            shard,
            self.num_passages,
            self.entry.start,
            self.entry.end,
            spec.index_type,
            "GPU" if self.on_gpu else "CPU",
            ", memory-mapped" if settings.mmap and not self.on_gpu else "",
        )
        self.search_threads = self._batcher.run_sync(lambda: self._set_threads(faiss)).result()
        log.info("shard %d: %d search thread(s)", self.shard, self.search_threads)
        # From this many rows FAISS scores a batch with one matrix product (set_blas_rows); fewer, from 2 rows, in
        # one pass over the vectors (blocked_scan), which FAISS itself would make once per row.
        self._blas_rows = faiss_index.blas_rows(faiss, self.dim)
        self._scan: FlatScan | None = None
        if settings.blocked_scan and spec.index_type == "flat" and not self.on_gpu:
            # Here, as faiss is: the ``ragr1`` command imports this module for its flags in every image, and the
            # reward image has neither.
            from ragr1.services.retriever.scan import FlatScan, flat_vectors

            vectors = flat_vectors(faiss, self._index)
            self._scan = self._batcher.run_sync(lambda: FlatScan(vectors, spec.metric, self.search_threads)).result()

    def _set_threads(self, faiss: Any) -> int:
        """FAISS's threads for this shard's searches (0: every core) and the batch size from which they are one
        matrix product (``index.set_blas_rows``); run on the thread that runs the searches: OpenMP keeps a thread
        count per thread, and one set on another thread leaves the searches on every core."""
        if self.settings.search_threads > 0:
            faiss.omp_set_num_threads(self.settings.search_threads)
        faiss_index.set_blas_rows(faiss, self.settings.blas_rows_per_thread, self.dim)
        return int(faiss.omp_get_max_threads())

    @property
    def num_passages(self) -> int:
        return self.entry.end - self.entry.start

    def _search_batch(self, requests: Sequence[ShardQuery]) -> list[ShardAnswer]:
        k = min(max(top_k for _, top_k in requests), self.num_passages)
        queries = np.concatenate([q for q, _ in requests]) if len(requests) > 1 else requests[0][0]
        with metrics.SHARD_SEARCH_SECONDS.time():
            if self._scan is not None and 2 <= len(queries) < self._blas_rows:
                scores, rows = self._scan.search(queries, k)
            else:
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
        if self._scan is not None:
            self._scan.close()
        self.store.close()
