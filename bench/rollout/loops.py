"""Rollout loops: lock-step turns against every trajectory on its own, on the real vLLM engine.

Both rollout workers (``RolloutWorker`` with ``rollout_loop`` lockstep, ``StreamingRolloutWorker`` with async)
run in one process against one vLLM engine (SmolLM2-135M-Instruct on the CPU by default), real Redis, a real
reward server and a real retriever (a shard per index file and the router, over the stack's cached index of
the first 1,000 passages), over the same HotpotQA prompts with the same seeds (seeds follow a trajectory's
sample index, so both loops draw the same trajectories). Each search call gets an added delay (0: the
retriever's natural latency; 0.1 and 0.5 s as a loaded or remote retriever), and each loop runs at each
in-flight size: at most that many trajectories at once (lock-step: batches of size / samples prompts; async:
``max_in_flight``). It prints rollouts/s and generated tokens/s, async's as ratios over lock-step's, the
engine's idle fraction (time with no request in it) and its mean requests in flight.

On a machine shared with other work, ``--repeats N`` runs each pair N times, alternating the loops, and keeps
each loop's fastest run. ``--question-suffix`` is appended to every question (the untrained model seldom
searches on its own, which leaves the added delays nothing to delay).

    python bench/rollout/loops.py [--prompts 8] [--samples 2] [--sizes 4 8] [--delays 0 0.1 0.5]
                                  [--max-tokens 32] [--max-turns 2] [--repeats 1] [--question-suffix TEXT]
                                  [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.common import header  # noqa: E402
from ragr1.model_paths import policy_checkpoint  # noqa: E402
from ragr1.protocol.information import Passage  # noqa: E402
from ragr1.services.common.config import flags  # noqa: E402
from ragr1.services.common.process import ServiceProcess  # noqa: E402
from ragr1.services.common.redis_server import RedisServer, free_port  # noqa: E402
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue  # noqa: E402
from ragr1.services.policy.agent import GenerationRequest, LoopConfig, Sampling  # noqa: E402
from ragr1.services.policy.backends import RetrieverSearch, RewardServiceScorer  # noqa: E402
from ragr1.services.policy.engine import EngineSettings, VllmEngine  # noqa: E402
from ragr1.services.policy.loops import RolloutLoopSettings  # noqa: E402
from ragr1.services.policy.runtime import ASYNC, LOCKSTEP, Policy, RolloutLimits  # noqa: E402
from ragr1.services.policy.streaming import StreamingRolloutWorker  # noqa: E402
from ragr1.services.policy.worker import RolloutWorker, WorkerSettings  # noqa: E402
from ragr1.services.retriever.config import RouterConfig, ShardConfig  # noqa: E402
from ragr1.shipped import read_jsonl, train_path  # noqa: E402
from ragr1.stack.config import StackConfig  # noqa: E402
from ragr1.stack.index_cache import ensure_index  # noqa: E402
from ragr1.v1 import common_pb2  # noqa: E402

INDEX_PASSAGES = 1000


class Delayed:
    """The retriever with ``delay`` seconds added to every call, as a loaded or remote one would take."""

    def __init__(self, search: RetrieverSearch, delay: float) -> None:
        self.search_backend = search
        self.delay = delay

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        await asyncio.sleep(self.delay)
        return await self.search_backend.search(queries, groups)


@contextlib.contextmanager
def services(root: Path) -> Iterator[tuple[str, str]]:
    """The retriever (its shards and router) and the reward server, as processes; yields their addresses."""
    stack = StackConfig()
    index = ensure_index(INDEX_PASSAGES, stack.num_shards, stack.index_type, stack.max_passage_tokens)
    shard_ports = [free_port() for _ in range(stack.num_shards)]
    router_port, reward_port = free_port(), free_port()
    shards = [
        ServiceProcess.ragr1(f"shard-{i}", ["serve", "retriever-shard", *flags(ShardConfig, {
            "index": str(index), "shard": i, "port": port, "metrics_port": 0})], f"127.0.0.1:{port}",
            root / f"shard-{i}.log")
        for i, port in enumerate(shard_ports)
    ]
    router = ServiceProcess.ragr1("retriever", ["serve", "retriever", *flags(RouterConfig, {
        "index": str(index), "shards": [f"127.0.0.1:{p}" for p in shard_ports], "port": router_port,
        "metrics_port": 0, "http_port": -1})], f"127.0.0.1:{router_port}", root / "router.log")
    reward = ServiceProcess.ragr1("reward", ["serve", "reward", "--port", str(reward_port), "--metrics-port", "0"],
                                  f"127.0.0.1:{reward_port}", root / "reward.log")
    with contextlib.ExitStack() as stack_:
        for service in [*shards, router, reward]:
            stack_.enter_context(service)
        yield router.target, reward.target


@dataclasses.dataclass
class Result:
    loop: str
    seconds: float
    rollouts: int
    tokens: int
    idle: float
    occupancy: float
    rounds: float

    def row(self, base: Result | None) -> str:
        rate, tok = self.rollouts / self.seconds, self.tokens / self.seconds
        ratios = "" if base is None else (
            f"  x{rate / (base.rollouts / base.seconds):.2f} rollouts/s"
            f"  x{tok / (base.tokens / base.seconds):.2f} tok/s"
        )
        return (f"  {self.loop:<9} {self.seconds:6.1f} s  {rate:5.2f} rollouts/s  {tok:6.1f} tok/s  "
                f"engine idle {self.idle:4.0%}  requests in engine {self.occupancy:4.1f}  "
                f"searches/rollout {self.rounds:.2f}{ratios}")


@dataclasses.dataclass
class Bench:
    engine: VllmEngine
    tokenizer: Any
    client: redis.Redis
    retriever: str
    reward: str
    tasks: list[common_pb2.PromptTask]
    loop_config: LoopConfig
    sampling: Sampling

    async def run(self, loop: str, size: int, delay: float, samples: int) -> Result:
        self.client.flushall()
        prompts = StreamQueue(self.client, PROMPTS, common_pb2.PromptTask, group="bench", consumer="bench-0")
        prompts.ensure_group()
        rollouts = StreamQueue(self.client, ROLLOUTS, common_pb2.Rollout, group="trainer")
        rollouts.ensure_group()
        prompts.produce(self.tasks)
        search = RetrieverSearch(self.retriever, top_k=self.loop_config.top_k, timeout=60)
        scorer = RewardServiceScorer(self.reward)
        policy = Policy(self.engine, self.tokenizer, Delayed(search, delay), self.loop_config,
                        model_dir=self.engine.model, default_sampling=self.sampling, limits=RolloutLimits(),
                        schedule=RolloutLoopSettings(rollout_loop=loop))
        # Nothing fails here: a failed prompt would be tried again at once.
        settings = WorkerSettings(worker_block_ms=50, retry_backoff_seconds=0.0, retry_backoff_max_seconds=0.0,
                                  grace_seconds=0.0)
        worker = (
            StreamingRolloutWorker(policy, scorer, prompts, rollouts, self.sampling,
                                   dataclasses.replace(settings, worker_batch=1), max_in_flight=size)
            if loop == ASYNC
            else RolloutWorker(policy, scorer, prompts, rollouts, self.sampling,
                               dataclasses.replace(settings, worker_batch=max(1, size // samples)))
        )
        wanted = len(self.tasks) * samples
        occupancy = self.engine.occupancy
        start = occupancy.settle()
        idle, requests = occupancy.idle_seconds, occupancy.request_seconds
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        produced: list[common_pb2.Rollout] = []
        while len(produced) < wanted:
            produced += [d.message for d in await asyncio.to_thread(rollouts.consume, wanted, 20)]
            if running.done():
                raise RuntimeError(f"the {loop} worker stopped early: {running.exception()!r}")
        end = occupancy.settle()
        stop.set()
        await running
        await search.close()
        await scorer.close()
        seconds = end - start
        return Result(
            loop, seconds, len(produced), sum(sum(r.loss_mask) for r in produced),
            (occupancy.idle_seconds - idle) / seconds, (occupancy.request_seconds - requests) / seconds,
            sum(r.retrieval_rounds for r in produced) / len(produced),
        )


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    model = policy_checkpoint(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = list(read_jsonl(train_path("hotpotqa"), limit=args.prompts))
    tasks = [common_pb2.PromptTask(id=r["id"], question=r["question"] + args.question_suffix,
                                   golden_answers=r["golden_answers"],
                                   mode=common_pb2.SEARCH_MODE_MULTI, num_samples=args.samples) for r in rows]
    loop_config = LoopConfig(max_turns=args.max_turns, max_model_len=2048, tokens_per_query=128)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens_per_turn=args.max_tokens, seed=1234)
    print(f"{header()}; model {model}")
    print(f"{len(tasks)} HotpotQA prompts x {args.samples} samples, multi-query mode, up to {args.max_turns} turns + "
          f"a final one, {args.max_tokens} tokens per turn, temperature 1.0, seed 1234, question suffix "
          f"{args.question_suffix!r}, fastest of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis_server, services(Path(tmp)) as (retr, rew):
        engine = VllmEngine.start(EngineSettings(max_model_len=2048, kv_cache_gib=1), model)
        try:
            # A first short request warms the engine up, as a served engine would be.
            await engine.generate([GenerationRequest(tokenizer.encode("Hello"), 4, None)], sampling, ())
            bench = Bench(engine, tokenizer, redis_server.client(), retr, rew, tasks, loop_config, sampling)
            summary = []
            for delay in args.delays:
                for size in args.sizes:
                    print(f"added search delay {delay * 1000:.0f} ms, in flight {size}:", flush=True)
                    runs: dict[str, list[Result]] = {LOCKSTEP: [], ASYNC: []}
                    for _ in range(args.repeats):
                        for loop in runs:
                            runs[loop].append(await bench.run(loop, size, delay, args.samples))
                            print(runs[loop][-1].row(None), flush=True)
                    base, other = (min(runs[loop], key=lambda r: r.seconds) for loop in (LOCKSTEP, ASYNC))
                    print(f"  fastest of {args.repeats}:\n{base.row(None)}\n{other.row(base)}", flush=True)
                    summary.append((delay, size, base, other))
        finally:
            engine.shutdown()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("| added delay | in flight | lock-step tok/s | async tok/s | tok/s ratio | rollouts/s ratio | "
          "engine idle lock-step / async | requests in engine lock-step / async |")
    print("|---|---|---|---|---|---|---|---|")
    for delay, size, base, other in summary:
        b, o = base.tokens / base.seconds, other.tokens / other.seconds
        print(f"| {delay * 1000:.0f} ms | {size} | {b:.1f} | {o:.1f} | x{o / b:.2f} | "
              f"x{(other.rollouts / other.seconds) / (base.rollouts / base.seconds):.2f} | "
              f"{base.idle:.0%} / {other.idle:.0%} | {base.occupancy:.1f} / {other.occupancy:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt (a GRPO group)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8], help="trajectories in flight at most")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.1, 0.5], help="added seconds per search")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per turn")
    parser.add_argument("--max-turns", type=int, default=2, help="turns before the final answer turn")
    parser.add_argument("--repeats", type=int, default=1, help="runs per loop, alternating; the fastest is kept")
    parser.add_argument("--question-suffix", default="", help="appended to every question")
    parser.add_argument("--model", default="", help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Both cores compute, as in the tests (vLLM keeps one for itself by default).
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    asyncio.run(main(parser.parse_args()))
