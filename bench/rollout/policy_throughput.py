"""Rollout throughput of the policy: vLLM against a plain ``transformers`` generate loop.

Both engines run the same agent loop (RAG-R1's prompts, stop strings, max turns, a final answer
turn) on the same HotpotQA questions with the same sampling settings, in one run:

1. ``transformers``: batched ``model.generate`` (left padding, the same stop strings), the baseline;
2. vLLM out of the box (``enforce_eager``; vLLM keeps one of the two cores for itself);
3. vLLM tuned: both cores for compute (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``,
   ``VLLM_CPU_OMP_THREADS_BIND``), Intel OpenMP preloaded; with ``--compile`` also torch.compile
   (a longer load, faster decoding).

It prints trajectories/s and generated tokens/s per engine and the ratios to the baseline. With
``--retriever-address`` (a running ``ragr1 serve retriever``) it also compares single- and
multi-query mode on the tuned vLLM engine: retrieval rounds per question, retriever calls, wall
time per question.

    python bench/rollout/policy_throughput.py [--questions 16] [--max-tokens 64] [--compile]
                                      [--retriever-address 127.0.0.1:50051] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ragr1.model_paths import policy_checkpoint  # noqa: E402
from ragr1.protocol import grammar  # noqa: E402
from ragr1.protocol.information import Passage  # noqa: E402
from ragr1.protocol.prompts import Mode  # noqa: E402
from ragr1.services.policy.agent import (  # noqa: E402
    AgentLoop,
    Generation,
    GenerationRequest,
    LoopConfig,
    Sampling,
    Task,
    Trajectory,
)
from ragr1.services.policy.backends import RetrieverSearch  # noqa: E402
from ragr1.services.policy.engine import EngineSettings, VllmEngine  # noqa: E402
from ragr1.shipped import read_jsonl, train_path  # noqa: E402


class TransformersEngine:
    """The baseline: one padded ``generate`` call per turn, sampling and stop strings as vLLM's; on ``device``
    (``cuda`` for the GPU check, bench/gpu/check.py) in ``dtype`` (a torch dtype's name)."""

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
        self.model = (
            AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).to(self.device).eval()
        )

    def _cut(self, ids: list[int], stop: Sequence[str]) -> tuple[int, str | None]:
        """Where a real engine would have stopped: after EOS or the token completing a stop string."""
        eos = self.tokenizer.eos_token_id
        for n in range(1, len(ids) + 1):
            if ids[n - 1] == eos:
                return n, None
            text = self.tokenizer.decode(ids[:n])
            for s in stop:
                if s in text:
                    return n, s
        return len(ids), None

    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: Sampling, stop: Sequence[str]
    ) -> list[Generation]:
        return await asyncio.to_thread(self._generate, requests, sampling, stop)

    def _generate(
        self, requests: Sequence[GenerationRequest], sampling: Sampling, stop: Sequence[str]
    ) -> list[Generation]:
        torch = self.torch
        width = max(len(r.prompt_ids) for r in requests)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in requests])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests])
        ids, mask = ids.to(self.device), mask.to(self.device)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(r.max_tokens for r in requests),
                do_sample=sampling.temperature > 0,
                temperature=sampling.temperature or None,
                top_p=sampling.top_p,
                stop_strings=list(stop) or None,  # an empty list is an error in generate
                tokenizer=self.tokenizer,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=pad,
            )
        new = out.sequences[:, width:]
        # Step by step: the whole [rows x steps x vocabulary] stack would be a second copy of the scores.
        logprobs = torch.stack(
            [s.float().log_softmax(-1).gather(-1, new[:, i : i + 1]).squeeze(-1) for i, s in enumerate(out.scores)],
            dim=1,
        ).cpu()
        new = new.cpu()
        results = []
        for row, request in enumerate(requests):
            tokens = new[row].tolist()[: request.max_tokens]
            n, stopped = self._cut(tokens, stop)
            # As vLLM reports it: "stop" on a stop string or the end-of-sequence token, which stays last.
            ended = stopped is not None or (n > 0 and tokens[n - 1] == self.tokenizer.eos_token_id)
            results.append(
                Generation(tokens[:n], logprobs[row, :n].tolist(), stopped, "stop" if ended else "length")
            )
        return results


class NoSearch:
    """For the throughput runs: the untrained model rarely searches, and no retriever is needed."""

    calls = 0

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        self.calls += 1
        return [[] for _ in queries]


@dataclasses.dataclass
class Run:
    name: str
    seconds: float
    trajectories: list[Trajectory]
    load_seconds: float

    @property
    def generated(self) -> int:
        return sum(sum(t.loss_mask) for t in self.trajectories)

    def row(self, baseline: Run | None) -> str:
        traj_rate = len(self.trajectories) / self.seconds
        tok_rate = self.generated / self.seconds
        ratio = "" if baseline is None else f"  x{tok_rate / (baseline.generated / baseline.seconds):.2f}"
        return (
            f"{self.name:<42} load {self.load_seconds:6.1f} s  rollout {self.seconds:6.1f} s  "
            f"{traj_rate:5.2f} traj/s  {tok_rate:7.1f} tok/s{ratio}"
        )


def tune_environment() -> None:
    """The tuned settings (3. above); vLLM's engine process reads them when it starts."""
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 2) - 1}"
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        os.environ["LD_PRELOAD"] = str(iomp)


async def run_loop(
    name: str,
    engine: Any,
    search: Any,
    tokenizer: Any,
    tasks: list[Task],
    cfg: LoopConfig,
    sampling: Sampling,
    load_seconds: float,
) -> Run:
    loop = AgentLoop(engine, search, tokenizer, cfg)
    start = time.perf_counter()
    trajectories = await loop.run(tasks, sampling, version=0)
    return Run(name, time.perf_counter() - start, trajectories, load_seconds)


async def vllm_run(
    name: str,
    settings: EngineSettings,
    model: Path,
    tokenizer: Any,
    tasks: list[Task],
    cfg: LoopConfig,
    sampling: Sampling,
    search: Any,
) -> Run:
    start = time.perf_counter()
    engine = VllmEngine.start(settings, model)
    try:
        # A first short request warms the engine up, as a served engine would be.
        await engine.generate([GenerationRequest(tokenizer.encode("Hello"), 4, None)], sampling, ())
        load = time.perf_counter() - start
        return await run_loop(name, engine, search, tokenizer, tasks, cfg, sampling, load)
    finally:
        engine.shutdown()


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    model = policy_checkpoint(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = list(read_jsonl(train_path("hotpotqa"), limit=args.questions))
    tasks = [Task(r["id"], r["question"]) for r in rows]
    cfg = LoopConfig(max_turns=args.max_turns, max_model_len=2048)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens_per_turn=args.max_tokens, seed=1234)
    print(
        f"{len(tasks)} HotpotQA questions, up to {args.max_turns} turns + a final one, {args.max_tokens} "
        f"tokens per turn, temperature 1.0, stop at {list(grammar.STOP_STRINGS)}; model {model}"
    )

    print(f"load average at start {os.getloadavg()[0]:.1f} (other processes slow every engine alike)")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    hf = TransformersEngine(model)
    baseline = await run_loop(
        "transformers generate (baseline)",
        hf,
        NoSearch(),
        tokenizer,
        tasks,
        cfg,
        sampling,
        time.perf_counter() - start,
    )
    print(baseline.row(None), flush=True)
    del hf

    settings = EngineSettings(max_model_len=2048, kv_cache_gib=2)
    runs = [
        await vllm_run("vLLM, out of the box (eager)", settings, model, tokenizer, tasks, cfg, sampling, NoSearch())
    ]
    print(runs[-1].row(baseline), flush=True)
    tune_environment()
    runs.append(
        await vllm_run(
            "vLLM, tuned (eager, 2 cores, iomp)", settings, model, tokenizer, tasks, cfg, sampling, NoSearch()
        )
    )
    print(runs[-1].row(baseline), flush=True)
    tuned = settings
    if args.compile:
        tuned = dataclasses.replace(settings, enforce_eager=False)
        runs.append(
            await vllm_run("vLLM, tuned + torch.compile", tuned, model, tokenizer, tasks, cfg, sampling, NoSearch())
        )
        print(runs[-1].row(baseline), flush=True)

    print(f"\nSummary (generated tokens/s relative to transformers; load average {os.getloadavg()[0]:.1f}):")
    print(baseline.row(None))
    for run in runs:
        print(run.row(baseline))

    if not args.retriever_address:
        print("\nSingle- vs multi-query: pass --retriever-address of a running `ragr1 serve retriever`.")
        return
    print(f"\nSingle- vs multi-query mode (tuned vLLM, retriever at {args.retriever_address}):")
    for mode in (Mode.SINGLE, Mode.MULTI):
        search = RetrieverSearch(args.retriever_address, top_k=3, timeout=30)
        mode_tasks = [dataclasses.replace(t, mode=mode) for t in tasks]
        run = await vllm_run(mode.value, tuned, model, tokenizer, mode_tasks, cfg, sampling, search)
        await search.close()
        n = len(run.trajectories)
        rounds = sum(t.retrieval_rounds for t in run.trajectories) / n
        queries = sum(t.num_queries for t in run.trajectories) / n
        print(
            f"  {run.name:<7} retrieval rounds/question {rounds:.2f}  queries/question {queries:.2f}  "
            f"retriever calls {search.calls}  wall time/question {run.seconds / n:.2f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per turn")
    parser.add_argument("--max-turns", type=int, default=1, help="turns before the final answer turn")
    parser.add_argument("--compile", action="store_true", help="also run vLLM with torch.compile (slow load)")
    parser.add_argument("--retriever-address", default="", help="compare single- and multi-query mode")
    parser.add_argument("--torch-threads", type=int, default=0, help="threads of the transformers baseline")
    parser.add_argument("--model", default="", help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(main(parser.parse_args()))
