"""``GrpcServer.serve``'s lifecycle, which every service's ``serve(config)`` relies on: the jobs beside the
server (a rollout worker, the training loop, a watchdog) decide the exit code, a job that ends stops the
server, and at shutdown jobs are asked to finish before the clean-ups run. Real servers on real sockets."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

import pytest

from ragr1.errors import ServiceCallError
from ragr1.services.common.client import HealthClient
from ragr1.services.common.server import ExitWith, GrpcServer
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.loop import TrainerStatus
from ragr1.services.trainer.servicer import TrainerServicer
from ragr1.v1 import trainer_pb2_grpc
from tests.common.waiting import holds_for_async, wait_event_async, wait_for_async


def server() -> GrpcServer:
    s = GrpcServer(RewardConfig(port=0, metrics_port=0, grace_seconds=1), "lifecycle-test")
    s.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(TrainerStatus()))
    return s


def test_a_job_that_finishes_stops_the_server_with_exit_code_0() -> None:
    s = server()
    served: list[bool] = []

    def check() -> bool:
        with HealthClient(f"127.0.0.1:{s.port}") as client:
            return client.health(timeout=5, service="ragr1.v1.Trainer")

    async def job() -> None:
        # The server answers while the job runs, under the service name taken from the proto.
        served.append(await asyncio.to_thread(check))

    s.beside(job, "a short job")
    assert asyncio.run(asyncio.wait_for(s.serve(), 30)) == 0
    assert served == [True]
    with pytest.raises(ServiceCallError), HealthClient(f"127.0.0.1:{s.port}") as client:
        client.health(timeout=1)  # the server is gone


def test_a_job_that_raises_stops_the_server_with_exit_code_1_and_says_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = server()
    cleaned: list[str] = []

    running = asyncio.Event()

    async def failing() -> None:
        await running.wait()  # fails while the other job runs
        raise RuntimeError("the engine is gone")

    async def forever() -> None:
        running.set()
        await asyncio.Event().wait()

    async def clean_up() -> None:
        cleaned.append("closed")

    s.beside(failing, "the watchdog")
    s.beside(forever, "a job without a stop hook")
    s.on_stop(clean_up)
    assert asyncio.run(asyncio.wait_for(s.serve(), 30)) == 1
    assert cleaned == ["closed"]
    assert "lifecycle-test: the watchdog stopped the server: RuntimeError: the engine is gone" in caplog.text


def test_a_job_that_exits_with_its_own_code_stops_the_server_with_it_unless_another_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def out_of_signal() -> None:
        raise ExitWith(3, "no group to train on")

    s = server()
    s.beside(out_of_signal, "the training loop")
    assert asyncio.run(asyncio.wait_for(s.serve(), 30)) == 3
    assert "lifecycle-test: the training loop stopped the server (exit code 3): no group to train on" in caplog.text

    # The chosen end first, then a job that fails as it is asked to stop: the failure decides, so a supervisor
    # never reads a crash as the end a job chose.
    asked = asyncio.Event()

    async def fails_at_stop() -> None:
        await asked.wait()
        raise RuntimeError("the engine is gone")

    s = server()
    s.beside(out_of_signal, "the training loop")
    s.beside(fails_at_stop, "the watchdog", stop=asked.set)
    assert asyncio.run(asyncio.wait_for(s.serve(), 30)) == 1
    with pytest.raises(ValueError, match="exit code 1 is"):
        ExitWith(1, "a failure by another name")


def test_on_sigterm_jobs_are_asked_to_finish_before_the_clean_ups_run() -> None:
    s = server()
    order: list[str] = []
    finish = asyncio.Event()
    worker_runs, watchdog_runs = asyncio.Event(), asyncio.Event()

    async def worker() -> None:
        worker_runs.set()
        await finish.wait()
        # The batch in hand takes a while after the stop request; nothing is closed under it meanwhile.
        await holds_for_async(lambda: "clients closed" not in order, "the clean-ups wait for the batch in hand", 0.2)
        order.append("worker finished its batch")

    async def watchdog() -> None:
        watchdog_runs.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append("watchdog cancelled")
            raise

    async def clean_up() -> None:
        order.append("clients closed")

    async def terminate_once_running() -> None:  # the jobs run once serve() handles SIGTERM
        await wait_event_async(worker_runs, "the worker never ran")
        await wait_event_async(watchdog_runs, "the watchdog never ran")
        os.kill(os.getpid(), signal.SIGTERM)

    def stop_worker() -> None:
        order.append("worker asked to stop")
        finish.set()

    s.beside(worker, "the worker", stop=stop_worker, stop_seconds=5)
    s.beside(watchdog, "the watchdog")
    s.on_stop(clean_up)

    async def main() -> int:
        killer = asyncio.ensure_future(terminate_once_running())
        code = await s.serve()
        await killer
        return code

    assert asyncio.run(asyncio.wait_for(main(), 30)) == 0
    assert order == ["worker asked to stop", "worker finished its batch", "clients closed", "watchdog cancelled"]


def test_a_job_that_ignores_its_stop_request_is_cut_off_after_stop_seconds() -> None:
    s = server()

    running = asyncio.Event()

    async def stubborn() -> None:
        running.set()
        await asyncio.Event().wait()

    async def short() -> None:
        await running.wait()  # ends while the stubborn job runs

    s.beside(stubborn, "a stubborn job", stop=lambda: None, stop_seconds=0.5)
    s.beside(short, "a short job")
    loop = asyncio.new_event_loop()
    try:
        start = loop.time()
        assert loop.run_until_complete(asyncio.wait_for(s.serve(), 30)) == 0
        assert loop.time() - start < 10
    finally:
        loop.close()


def test_on_sigterm_every_job_is_asked_to_stop_before_the_server_drains_and_all_share_one_deadline() -> None:
    """A rollout worker must take no new prompt while the server drains its calls (drain_seconds), and jobs
    stopping one after another must not add their stop_seconds up past the deployment's grace period."""
    s = GrpcServer(RewardConfig(port=0, metrics_port=0, grace_seconds=1, drain_seconds=1.0), "lifecycle-test")
    s.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(TrainerStatus()))
    asked: dict[str, float] = {}
    running: set[str] = set()

    def stubborn(name: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], None]]:
        async def job() -> None:
            running.add(name)
            await asyncio.Event().wait()

        def stop() -> None:
            asked[name] = asyncio.get_running_loop().time()
        return job, stop

    for name in ("worker", "follower"):
        job, stop = stubborn(name)
        s.beside(job, name, stop=stop, stop_seconds=2.0)

    async def main() -> float:
        loop = asyncio.get_running_loop()

        async def terminate_once_running() -> None:  # the jobs run once serve() handles SIGTERM
            await wait_for_async(lambda: running == {"worker", "follower"}, "the jobs never ran", 10)
            os.kill(os.getpid(), signal.SIGTERM)

        killer = asyncio.ensure_future(terminate_once_running())
        await s.serve()
        await killer
        return loop.time()

    loop = asyncio.new_event_loop()
    try:
        start = loop.time()
        ended = loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()
    assert set(asked) == {"worker", "follower"}
    assert max(asked.values()) - start < 1.0  # asked at the signal, before the 1 s drain
    assert ended - min(asked.values()) < 3.0  # one 2 s deadline for both, not 2 + 2 after the drain
