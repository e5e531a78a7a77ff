"""Micro-batching: concurrent requests become one call on a worker thread.

The encoder and a FAISS index each do far more work per second on one batch of 32 rows than on 32
calls of one row, and a (GPU) FAISS index must not be used from two threads. A ``MicroBatcher`` owns
its worker threads (a shard's one: the index's owner); ``submit`` queues a request and awaits its
share of the result. While the workers are busy, new requests queue, and the next batch takes
everything queued (up to ``max_batch_rows``), waiting at most ``max_wait_s`` for more when the queue
is short. ``max_batch_rows=1`` turns batching off: each request is its own call. More than one
worker suits thread-safe work such as CPU encoding, where two single-threaded batches in parallel
use two cores better than one batch on two intra-op threads. With ``split_when_idle``, a batch taken
while other workers are free and nothing else is queued is split among them: one call of three
queries on an idle CPU encoder then costs about one query's time, not three. These four are a
``Batching``, which the server that owns the batcher makes from its config.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ragr1.services.common.config import Validated, check_at_least

In = TypeVar("In")
Out = TypeVar("Out")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Batching(Validated):
    """How a ``MicroBatcher`` batches. No defaults here: the config of the server that owns a batcher gives
    each (the router's encoder batches: ``RouterSettings.embed_batching``; a shard's searches:
    ``ShardSettings.search_batching``)."""

    max_batch_rows: int
    max_wait_s: float
    workers: int
    split_when_idle: bool

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_batch_rows", 1), ("workers", 1), ("max_wait_s", 0)))


@dataclasses.dataclass
class _Pending(Generic[In, Out]):
    item: In
    rows: int
    future: asyncio.Future[Out]
    queued_at: float


class MicroBatcher(Generic[In, Out]):
    """Runs ``fn(items) -> outputs`` (same length, same order) over batches of submitted items."""

    def __init__(
        self,
        fn: Callable[[Sequence[In]], Sequence[Out]],
        settings: Batching,
        *,
        name: str = "batcher",
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        self._fn = fn
        self.settings = settings
        # on_batch(rows, waits): rows in the batch, and how long each request waited to get in.
        self._on_batch = on_batch
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix=name)
        self._running: set[asyncio.Task[None]] = set()
        self._queue: asyncio.Queue[_Pending[In, Out]] | None = None
        self._task: asyncio.Task[None] | None = None
        # A request that did not fit into the last batch; it leads the next one.
        self._carry: _Pending[In, Out] | None = None

    def run_sync(self, fn: Callable[[], R]) -> concurrent.futures.Future[R]:
        """Runs ``fn`` on a worker thread (with one worker: the thread that owns the index)."""
        return self._executor.submit(fn)

    async def submit(self, item: In, rows: int = 1) -> Out:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(item, rows, future, time.perf_counter()))
        return await future

    async def _collect(self) -> list[_Pending[In, Out]]:
        assert self._queue is not None
        first, self._carry = self._carry, None
        batch = [first or await self._queue.get()]
        rows = batch[0].rows
        deadline = time.perf_counter() + self.settings.max_wait_s
        while rows < self.settings.max_batch_rows:
            if self._queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                nxt = self._queue.get_nowait()
            if rows + nxt.rows > self.settings.max_batch_rows:
                self._carry = nxt
                break
            batch.append(nxt)
            rows += nxt.rows
        return batch

    async def _loop(self) -> None:
        # A batch is collected only when a worker is free, so requests pile up (and batch) meanwhile.
        free = asyncio.Semaphore(self.settings.workers)
        while True:
            await free.acquire()
            batch = [p for p in await self._collect() if not p.future.done()]
            if not batch:
                free.release()
                continue
            lanes = 1
            if self.settings.split_when_idle:
                # Idle workers and nothing waiting: each takes a share (never blocks: the slot is free).
                while lanes < len(batch) and not free.locked() and self._queue is not None and self._queue.empty():
                    await free.acquire()
                    lanes += 1
            bounds = [len(batch) * i // lanes for i in range(lanes + 1)]  # lanes <= len(batch): none empty
            for part in (batch[a:b] for a, b in itertools.pairwise(bounds)):
                task = asyncio.get_running_loop().create_task(self._run(part))
                self._running.add(task)

                def done(t: asyncio.Task[None]) -> None:
                    self._running.discard(t)
                    free.release()

                task.add_done_callback(done)

    async def _run(self, batch: list[_Pending[In, Out]]) -> None:
        started = time.perf_counter()
        if self._on_batch is not None:
            self._on_batch(sum(p.rows for p in batch), [started - p.queued_at for p in batch])
        try:
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(self._executor, self._fn, [p.item for p in batch])
            if len(outputs) != len(batch):
                raise RuntimeError(f"batch function returned {len(outputs)} results for {len(batch)} items")
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, out in zip(batch, outputs, strict=True):
            if not p.future.done():
                p.future.set_result(out)

    async def aclose(self) -> None:
        for task in [self._task, *self._running]:
            if task is not None:
                task.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)
