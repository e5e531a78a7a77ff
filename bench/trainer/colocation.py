"""A PPO update beside a generating vLLM engine on the same CPU cores, as in `ragr1 demo` and `ragr1 up`.

On a small machine the trainer and the policy share the cores: while the trainer runs update v, the
rollout worker already generates the batch for v+1 (bounded staleness). vLLM's CPU engine binds its
compute threads to the cores it does not reserve; torch in the trainer starts one thread per core. This
measures what the contention costs and which trainer thread count is best, in one run:

- the update alone (the baseline) with N and 1 torch threads,
- the update while a real vLLM engine generates without pause, with N and 1 torch threads,
- vLLM's tokens/s alone and during each co-located update.

    python bench/trainer/colocation.py [--rollouts 8] [--response-tokens 768]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from trainer_throughput import rollout_samples

from ragr1.model_paths import prepare_policy_model
from ragr1.services.policy.agent import GenerationRequest, Sampling
from ragr1.services.policy.engine import EngineSettings, VllmEngine
from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.model import PolicyModel
from ragr1.services.trainer.updater import PPOUpdater, Sample


class Generator:
    """A vLLM engine on its own event loop thread, generating batches back to back while ``on`` is set."""

    def __init__(self, model_dir: Path, batch: int, tokens: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.on = threading.Event()
        # (time, tokens) of every finished batch: rates are measured between batch ends, since a
        # batch's tokens are only counted once it returns.
        self.finished: list[tuple[float, int]] = []
        self.batch, self.max_tokens = batch, tokens
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        settings = EngineSettings(max_model_len=2048, kv_cache_gib=1)
        self.engine: VllmEngine = asyncio.run_coroutine_threadsafe(self._start(settings, model_dir), self.loop).result()
        asyncio.run_coroutine_threadsafe(self._generate_forever(), self.loop)

    async def _start(self, settings: EngineSettings, model_dir: Path) -> VllmEngine:
        return VllmEngine.start(settings, model_dir)

    async def _generate_forever(self) -> None:
        prompt = list(range(1000, 1300))  # a 300-token prompt, like a question with its instructions
        seed = 0
        while True:
            if not self.on.is_set():
                await asyncio.sleep(0.05)
                continue
            requests = [GenerationRequest(prompt, self.max_tokens, seed + i) for i in range(self.batch)]
            seed += self.batch
            out = await self.engine.generate(requests, Sampling(temperature=1.0), ())  # no stop strings
            self.finished.append((time.perf_counter(), sum(len(g.token_ids) for g in out)))

    def rate(self, start: float, end: float) -> float:
        """Tokens/s of the batches that ended within [start, end], from the first such end to the last."""
        inside = [(t, n) for t, n in self.finished if start <= t <= end]
        if len(inside) < 2:
            raise RuntimeError("fewer than two batches ended in the window: lengthen it")
        return sum(n for _, n in inside[1:]) / (inside[-1][0] - inside[0][0])

    def run_alone(self, batches: int) -> float:
        """Tokens/s of ``batches`` batches generated with nothing else running."""
        self.on.set()
        first = len(self.finished)
        while len(self.finished) < first + batches:
            time.sleep(0.1)
        self.on.clear()
        return self.rate(self.finished[first][0], self.finished[-1][0])

    def shutdown(self) -> None:
        self.on.clear()
        self.engine.shutdown()


def timed_update(updater: PPOUpdater, samples: list[Sample], threads: int) -> float:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    updater.update(samples)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per update (the demo's: 8)")
    parser.add_argument("--response-tokens", type=int, default=768, help="response length of each rollout")
    parser.add_argument("--gen-batch", type=int, default=8, help="vLLM requests generated concurrently")
    args = parser.parse_args()
    cores = torch.get_num_threads()
    model_dir = prepare_policy_model()
    samples = rollout_samples(PolicyModel(model_dir).tokenizer, args.rollouts, args.response_tokens)
    for i, s in enumerate(samples):
        s.group_id = f"g{i // 4}"
    # The demo's RL shape: GRPO groups of 4, LoRA rank 16, mini-batch 4, micro-batch 2.
    settings = PPOSettings(advantage="grpo", lora_rank=16, mini_batch_size=4, micro_batch_size=2)
    updater = PPOUpdater.build(settings, model_dir)
    updater.update(samples[:4])  # warm-up: allocations, first-call costs
    print(f"{len(samples)} rollouts of {args.response_tokens} response tokens; {os.cpu_count()} cores; "
          f"torch's default threads: {cores}")

    alone = {n: timed_update(updater, samples, n) for n in (cores, 1)}
    print(f"update alone: {alone}", flush=True)
    gen = Generator(model_dir, args.gen_batch, 192)
    try:
        gen.run_alone(2)  # warm-up
        gen_alone = gen.run_alone(5)
        beside: dict[int, tuple[float, float]] = {}
        for n in (cores, 1):
            gen.on.set()
            time.sleep(2.0)
            start = time.perf_counter()
            seconds = timed_update(updater, samples, n)
            beside[n] = (seconds, gen.rate(start, time.perf_counter()))
            gen.on.clear()
    finally:
        gen.shutdown()

    base = alone[cores]
    print(f"\nvLLM alone: {gen_alone:.1f} tokens/s")
    print(f"{'case':<34} {'update s':>9} {'x alone/' + str(cores):>12} {'vLLM tok/s':>11} {'x vLLM alone':>13}")
    for n in (cores, 1):
        print(f"{f'update alone, {n} threads':<34} {alone[n]:9.1f} {alone[n] / base:12.2f} {'-':>11} {'-':>13}")
    for n in (cores, 1):
        seconds, rate = beside[n]
        print(f"{f'update beside vLLM, {n} threads':<34} {seconds:9.1f} {seconds / base:12.2f} "
              f"{rate:11.1f} {rate / gen_alone:13.2f}")


if __name__ == "__main__":
    main()
