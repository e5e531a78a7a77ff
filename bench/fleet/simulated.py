"""What the scale rig (bench/fleet/scale_rig.py) simulates: an engine and the PPO step. Everything else in the rig
is the product's own code. Every figure that depends on these says "simulated".

``SimulatedEngine`` stands behind the policy's engine interface (``generate``, ``abort_all``, ``reload_weights``,
``sequences_at_once``) and behaves as vLLM's continuous batching does at the level the rig needs: up to
``max_num_seqs`` requests run at once (the rest wait in a queue, first come first served), and every running
request gets one token per decode step, whose duration depends on how many run (``LatencyModel``). It is
event-driven: nothing happens per token, only when a request arrives, ends or is aborted, so the engine's own CPU
time stays small next to the worker's, and is measured apart (``cpu_seconds``, the event loop thread's time in
its bookkeeping). What it generates is scripted (``TurnBank``): a thinking span of the turn's length, then a
``<search>`` of one to three real questions or passage titles (so the retriever does real work), or an
``<answer>``; the loop parses, searches, tokenises the passages and scores as it would with vLLM.

``SimulatedUpdater`` is the trainer's PPO step as a timed wait; its checkpoints are a tiny safetensors file of
their own per version (so each version has its own digest) beside the served model's config, which the replicas
check and load (a timed wait in the simulated engine) through the product's weight-version path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import json
import random
import shutil
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragr1.protocol import grammar
from ragr1.services.policy.agent import Generation, GenerationRequest, Sampling
from ragr1.services.policy.engine import batch_of

# The served model's files the replicas compare a checkpoint's config with (architecture fields).
CONFIG = "config.json"
WEIGHTS = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    """One engine's decode step: ``base_ms + per_seq_ms`` x the sequences it runs, slowed ``slowdown`` times (so
    that the rig's own processes keep up on a small machine). Prefill and prefix-cache misses are not modelled
    apart: the published step times were measured under a serving load, their interference included."""

    name: str
    base_ms: float
    per_seq_ms: float
    slowdown: float = 1.0
    source: str = ""

    def step_seconds(self, running: int) -> float:
        return self.slowdown * (self.base_ms + self.per_seq_ms * max(1, running)) / 1000.0

    def tokens_per_second(self, running: int) -> float:
        """The engine's decode rate with ``running`` sequences (tokens of all of them)."""
        return running / self.step_seconds(running)

    def describe(self) -> str:
        return (f"{self.name}: step = ({self.base_ms:g} ms + {self.per_seq_ms:g} ms x sequences) x "
                f"{self.slowdown:.3g} slowdown{f' [{self.source}]' if self.source else ''}")


# Llama-3.1-8B-Instruct, bf16, one H100-80GB, vLLM 0.21 (a published concurrency sweep: median time per output
# token 6.48 ms at one request, 10.94 ms at 16): the line through those two points.
H100_LLAMA_8B = LatencyModel(
    "Llama-3.1-8B-Instruct bf16, one H100-80GB, vLLM 0.21 (published)", base_ms=6.18, per_seq_ms=0.297,
    source="https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/: TPOT p50 6.48 ms at concurrency 1, "
    "10.94 ms at 16",
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the simulated policy writes: turns of ``tokens_per_turn`` generated tokens on average (uniform in
    [0.5, 1.5] x that), each a search with probability ``search_probability`` (RAG-R1 reports 2.15 retrieval
    rounds per question in multi-query mode; 0.75 gives about 2 with 4 turns), of 1 to ``max_queries`` queries."""

    tokens_per_turn: int = 150
    search_probability: float = 0.75
    max_queries: int = 3

    def expected_turns(self, max_turns: int) -> float:
        """Generation turns per trajectory: one, and one more after each search (at most ``max_turns`` of them)."""
        p = self.search_probability
        return 1.0 + sum(p**k for k in range(1, max_turns + 1))


class TurnBank:
    """Token ids of the pieces a scripted turn is made of, tokenised once: byte-level BPE decodes a concatenation
    of ids to the concatenation of their texts, so a turn is a list concatenation, not a tokenisation."""

    def __init__(self, tokenizer: Any, queries: Sequence[str], filler: str, answers: Sequence[str]) -> None:
        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        self.queries = [encode(q) for q in queries]
        self.filler = encode(filler)
        self.answers = [encode(a) for a in answers]
        self.think_open, self.think_close = encode("<think> "), encode(" </think>\n")
        self.search_open, self.search_close = encode("<search> "), encode(f" {grammar.SEARCH_STOP}")
        self.separator = encode(", ")
        self.answer_open, self.answer_close = encode("<answer> "), encode(f" {grammar.ANSWER_STOP}")

    def turn(self, rng: random.Random, workload: Workload, tokens: int) -> tuple[list[int], str]:
        """A turn of about ``tokens`` ids and the stop string it ends on."""
        if rng.random() < workload.search_probability:
            action = list(self.search_open)
            for i in range(rng.randint(1, workload.max_queries)):
                if i:
                    action += self.separator
                action += rng.choice(self.queries)
            action += self.search_close
            stop = grammar.SEARCH_STOP
        else:
            action = [*self.answer_open, *rng.choice(self.answers), *self.answer_close]
            stop = grammar.ANSWER_STOP
        think = max(1, tokens - len(action) - len(self.think_open) - len(self.think_close))
        start = rng.randrange(max(1, len(self.filler) - think))
        return [*self.think_open, *self.filler[start:start + think], *self.think_close, *action], stop


@dataclasses.dataclass
class _Request:
    ids: list[int]
    stop: str | None
    finish: str
    submitted: float
    done: asyncio.Future[Generation]
    context: int
    start_step: float = 0.0
    admitted: float = 0.0


@dataclasses.dataclass
class EngineStats:
    """Totals since the engine started; a reader takes differences between two reads."""

    requests: int = 0
    tokens: int = 0
    busy_seconds: float = 0.0
    # The integral of the running count over time, and of the batch's free places.
    request_seconds: float = 0.0
    empty_slot_seconds: float = 0.0
    idle_seconds: float = 0.0
    waiting_seconds: float = 0.0
    # CPU time of the event loop's thread spent in the engine's own bookkeeping (not the worker's).
    cpu_seconds: float = 0.0
    aborted: int = 0
    weight_loads: int = 0


class SimulatedEngine:
    """Continuous batching of scripted turns, timed by ``LatencyModel`` (see the module's docstring)."""

    def __init__(self, model: LatencyModel, workload: Workload, bank: TurnBank, *, max_num_seqs: int,
                 kv_cache_tokens: int, weight_load_seconds: float, seed: int) -> None:
        self.model = model
        self.workload = workload
        self.bank = bank
        self.max_num_seqs = max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens
        self.weight_load_seconds = weight_load_seconds
        self.rng = random.Random(seed)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._running: dict[int, _Request] = {}
        self._waiting: deque[tuple[int, _Request]] = deque()
        self._ends: list[tuple[float, int]] = []
        self._context = 0
        self._step = 0.0
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    # -- the policy's engine interface ------------------------------------------------------------
    def sequences_at_once(self, tokens_per_sequence: int) -> int:
        return batch_of(self.max_num_seqs, self.kv_cache_tokens, tokens_per_sequence)

    async def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling,
                       stop: Sequence[str]) -> list[Generation]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def abort_all(self) -> None:
        cpu = time.thread_time()
        self._advance()
        for rid, request in [*self._running.items(), *self._waiting]:
            made = max(0, int(self._step - request.start_step)) if rid in self._running else 0
            self._finish(rid, request, request.ids[:made], None, "abort")
        self._waiting.clear()
        self._schedule()
        self.stats.cpu_seconds += time.thread_time() - cpu

    async def reload_weights(self, checkpoint: Path) -> None:
        await asyncio.sleep(self.weight_load_seconds)
        self.stats.weight_loads += 1

    # -- the batch ------------------------------------------------------------------------------
    async def _one(self, request: GenerationRequest) -> Generation:
        cpu = time.thread_time()
        tokens = max(1, round(self.workload.tokens_per_turn * self.rng.uniform(0.5, 1.5)))
        ids, stop = self.bank.turn(self.rng, self.workload, tokens)
        finish = "stop"
        if len(ids) > request.max_tokens:
            ids, stop, finish = ids[: request.max_tokens], None, "length"
        done: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        entry = _Request(ids, stop, finish, time.monotonic(), done, len(request.prompt_ids) + len(ids))
        self._advance()
        self._waiting.append((next(self._ids), entry))
        self.stats.requests += 1
        self._admit()
        self._schedule()
        self.stats.cpu_seconds += time.thread_time() - cpu
        return await done

    def _advance(self) -> None:
        """Brings the step count and the totals up to now."""
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        running = len(self._running)
        s = self.stats
        s.empty_slot_seconds += max(0, self.max_num_seqs - running) * elapsed
        s.waiting_seconds += len(self._waiting) * elapsed
        if running:
            self._step += elapsed / self.model.step_seconds(running)
            s.busy_seconds += elapsed
            s.request_seconds += running * elapsed
        else:
            s.idle_seconds += elapsed

    def _fits(self, request: _Request) -> bool:
        if len(self._running) >= self.max_num_seqs:
            return False
        return self.kv_cache_tokens <= 0 or not self._running or (
            self._context + request.context <= self.kv_cache_tokens)

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0][1]):
            rid, request = self._waiting.popleft()
            request.start_step, request.admitted = self._step, time.monotonic()
            self._running[rid] = request
            self._context += request.context
            # The first token comes one step after admission; the last len(ids) steps after it.
            heapq.heappush(self._ends, (self._step + len(request.ids), rid))

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._ends and self._ends[0][1] not in self._running:
            heapq.heappop(self._ends)
        if not self._ends:
            return
        steps = max(0.0, self._ends[0][0] - self._step)
        delay = steps * self.model.step_seconds(len(self._running))
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        cpu = time.thread_time()
        self._timer = None
        self._advance()
        # Within a thousandth of a step: a timer that fires a hair early ends its request all the same.
        while self._ends and self._ends[0][0] <= self._step + 1e-3:
            _, rid = heapq.heappop(self._ends)
            request = self._running.get(rid)
            if request is not None:
                self._finish(rid, request, request.ids, request.stop, request.finish)
        self._admit()
        self._schedule()
        self.stats.cpu_seconds += time.thread_time() - cpu

    def _finish(self, rid: int, request: _Request, ids: list[int], stop: str | None, finish: str) -> None:
        if self._running.pop(rid, None) is not None:
            self._context -= request.context
        if finish == "abort":
            self.stats.aborted += 1
        self.stats.tokens += len(ids)
        now = time.monotonic()
        first = request.admitted - request.submitted + self.model.step_seconds(max(1, len(self._running)))
        if not request.done.done():
            request.done.set_result(
                Generation(list(ids), [-0.5] * len(ids), stop, finish, first, now - request.submitted))

    @property
    def running(self) -> int:
        return len(self._running)


class SimulatedUpdater:
    """The trainer's PPO step as a wait of ``seconds``; each version's weights a tiny file of their own."""

    def __init__(self, seconds: float, model_dir: Path) -> None:
        self.seconds = seconds
        self.model_dir = model_dir
        self.updates = 0

    def update(self, samples: Sequence[Any]) -> dict[str, float]:
        start = time.perf_counter()
        time.sleep(self.seconds)
        self.updates += 1
        tokens = sum(len(s.sequence.response_ids) for s in samples)
        seconds = time.perf_counter() - start
        return {"policy_loss": 0.0, "update_seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9)}

    def state(self) -> None:
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def save_policy(self, directory: Path) -> None:
        write_model(directory, self.model_dir / CONFIG, float(self.updates))

    def close(self) -> None:
        pass


def write_model(directory: Path, config: Path, value: float) -> Path:
    """A served model's files as the replicas check them: a real model's config and one tiny tensor."""
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, directory / CONFIG)
    save_file({"w": np.full((4,), value, dtype=np.float32)}, str(directory / WEIGHTS))
    return directory


def architecture_of(model: Path) -> dict[str, Any]:
    return dict(json.loads((model / CONFIG).read_text()))
