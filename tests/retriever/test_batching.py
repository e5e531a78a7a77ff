from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from ragr1.services.retriever.batching import Batching, MicroBatcher
from tests.common.waiting import wait_for_async

ONE_BY_ONE = Batching(max_batch_rows=1, max_wait_s=0.0, workers=1, split_when_idle=False)


class Doubler:
    """Records every batch and the thread it ran on."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.delay = delay

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.threads.add(threading.get_ident())
        self.batches.append(list(items))
        if self.delay:
            threading.Event().wait(self.delay)
        return [2 * i for i in items]


def test_concurrent_requests_share_batches_on_one_thread() -> None:
    fn = Doubler(delay=0.01)

    async def main() -> list[int]:
        batcher = MicroBatcher(fn, Batching(max_batch_rows=16, max_wait_s=0.005, workers=1, split_when_idle=False))
        out = await asyncio.gather(*(batcher.submit(i) for i in range(40)))
        await batcher.aclose()
        return list(out)

    assert asyncio.run(main()) == [2 * i for i in range(40)]
    assert len(fn.batches) < 40
    assert max(len(b) for b in fn.batches) <= 16
    assert len(fn.threads) == 1


def test_rows_bound_the_batch_and_one_row_turns_batching_off() -> None:
    fn = Doubler()

    async def main(max_rows: int) -> None:
        batcher = MicroBatcher(fn, Batching(max_batch_rows=max_rows, max_wait_s=0.01, workers=1, split_when_idle=False))
        await asyncio.gather(*(batcher.submit(i, rows=3) for i in range(6)))
        await batcher.aclose()

    asyncio.run(main(7))
    assert all(len(b) <= 2 for b in fn.batches)  # two requests of 3 rows fit in 7, three do not
    fn.batches.clear()
    asyncio.run(main(1))
    assert [len(b) for b in fn.batches] == [1] * 6


def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on() -> None:
    calls = []

    def fn(items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return list(items)

    async def main() -> int:
        batcher = MicroBatcher(fn, ONE_BY_ONE)
        with pytest.raises(ValueError, match="negative"):
            await batcher.submit(-1)
        out = await batcher.submit(5)
        await batcher.aclose()
        return out

    assert asyncio.run(main()) == 5


class Gated(Doubler):
    """Holds each batch until ``release`` is set; ``entered`` says one is in the function."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.entered.set()
        assert self.release.wait(30), "the test never released the batch"
        return super().__call__(items)


def test_a_cancelled_request_is_not_computed() -> None:
    fn = Gated()

    async def main() -> None:
        batcher = MicroBatcher(fn, ONE_BY_ONE)
        first = asyncio.ensure_future(batcher.submit(1))
        await wait_for_async(fn.entered.is_set, "the first request never ran")
        # 1 is running (held); 2 waits in the queue and is cancelled there.
        second = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0)  # not a wait: submit queues its request in its first step
        second.cancel()
        fn.release.set()
        assert await first == 2
        assert await batcher.submit(3) == 6
        await batcher.aclose()

    asyncio.run(main())
    assert fn.batches == [[1], [3]]


def test_two_workers_run_two_batches_at_once() -> None:
    fn = Doubler(delay=0.05)

    async def main() -> list[int]:
        batcher = MicroBatcher(fn, Batching(max_batch_rows=4, max_wait_s=0.0, workers=2, split_when_idle=False))
        out = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
        await batcher.aclose()
        return list(out)

    assert asyncio.run(main()) == [2 * i for i in range(16)]
    assert len(fn.threads) == 2


def test_idle_workers_split_a_batch_and_busy_ones_do_not() -> None:
    fn = Doubler(delay=0.05)

    async def main() -> None:
        batcher = MicroBatcher(
            fn, Batching(max_batch_rows=64, max_wait_s=0.005, workers=3, split_when_idle=True)
        )
        # One call of three rows on an idle batcher: a row a worker, all at once.
        assert await asyncio.gather(*(batcher.submit(i) for i in range(3))) == [0, 2, 4]
        assert sorted(map(sorted, fn.batches)) == [[0], [1], [2]] and len(fn.threads) == 3
        fn.batches.clear()
        # Five rows on three idle workers: shares of 1, 2, 2; every worker slot comes back afterwards.
        await asyncio.gather(*(batcher.submit(i) for i in range(5)))
        assert sorted(len(b) for b in fn.batches) == [1, 2, 2]
        fn.batches.clear()
        # Many at once: the first batches take everything queued; the workers still run all in parallel.
        out = await asyncio.gather(*(batcher.submit(i) for i in range(40)))
        assert out == [2 * i for i in range(40)]
        assert sum(len(b) for b in fn.batches) == 40
        await batcher.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_batch_rows": 0}, "max_batch_rows must be at least 1"),
    ({"workers": 0}, "workers must be at least 1"),
    ({"max_wait_s": -0.001}, "max_wait_s must be at least 0"),
])
def test_batching_out_of_range_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(ONE_BY_ONE, **changes)
