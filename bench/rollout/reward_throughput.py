"""Reward scoring throughput, against the time of the rollouts it scores.

Builds 256 realistic multi-query trajectories of about 2,000 tokens from the shipped HotpotQA
questions (two search rounds of three queries, the top 2 passages of each query taken from the
question's real paragraphs, right answers for half, wrong ones for the rest), then scores them:

1. in process (``RewardScorer.score_batch``);
2. through gRPC, one ``Score`` call per batch, against ``ragr1 serve reward`` in a child process;
3. through gRPC, one call per trajectory (the baseline: how the published code calls its services).

The issue's target is scoring under 1% of the rollout time. The rollout time of the same batch is
its generated tokens (the tokens outside <information>) at SmolLM2-135M's vLLM CPU rates
(``ROLLOUT_TOKENS_PER_SECOND``, as ``bench/rollout/policy_throughput.py`` measures them); a slower policy only
shrinks the reward's share.

    python bench/rollout/reward_throughput.py [--batch 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ragr1.model_paths import smollm2_dir  # noqa: E402
from ragr1.services.common.process import ServiceProcess  # noqa: E402
from ragr1.services.common.redis_server import free_port  # noqa: E402
from ragr1.services.reward.answers import normalize_answer  # noqa: E402
from ragr1.services.reward.client import RewardClient  # noqa: E402
from ragr1.services.reward.scoring import RewardScorer  # noqa: E402
from ragr1.services.reward.servicer import to_input  # noqa: E402
from ragr1.shipped import read_jsonl, train_path  # noqa: E402
from ragr1.v1 import common_pb2, reward_pb2  # noqa: E402

ROLLOUT_TOKENS_PER_SECOND = {"vLLM CPU, out of the box": 107.0, "vLLM CPU, tuned": 203.0}
ROUNDS = 2
QUERIES = 3
TOP_K = 2


def _trajectory(record: dict[str, Any], right: bool) -> reward_pb2.ScoreItem:
    paragraphs = record["paragraphs"]
    question = record["question"]
    parts: list[str] = []
    passages: list[common_pb2.Passage] = []
    rounds: list[int] = []
    for r in range(ROUNDS):
        parts.append(
            f"<think>To answer \"{question}\" I still need evidence; round {r + 1}: I will search for the "
            "entities in the question and check each candidate against the passages I already have, "
            "then compare what the sources say before deciding.</think>"
        )
        queries = [f"{question} ({p['title']})" for p in paragraphs[r * QUERIES : (r + 1) * QUERIES]]
        parts.append(f"<search> {', '.join(queries)} </search>")
        docs: list[str] = []
        for q in range(QUERIES):
            for k in range(TOP_K):
                p = paragraphs[(r * QUERIES + q + k) % len(paragraphs)]
                docs.append(f"Doc {len(docs) + 1}(Title: {p['title']}) {p['text']}")
                passages.append(common_pb2.Passage(id=p["pid"], title=p["title"], text=p["text"]))
                rounds.append(r)
        parts.append("<information>" + "\n".join(docs) + "</information>")
    answer = record["golden_answers"][0] if right else paragraphs[-1]["title"]
    parts.append(f"<think>The passages agree, so the answer is {answer}.</think><answer> {answer} </answer>")
    return reward_pb2.ScoreItem(
        id=record["id"], response="".join(parts), golden_answers=record["golden_answers"],
        supporting_titles=record["supporting_titles"], retrieved=passages, retrieved_rounds=rounds,
    )


def _count_tokens(texts: list[str]) -> list[int]:
    """SmolLM2's tokenizer when the prepared checkpoint is cached, else 4 characters a token."""
    model = smollm2_dir()
    if (model / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        return [len(ids) for ids in tokenizer(texts)["input_ids"]]
    return [len(t) // 4 for t in texts]


def _generated_part(text: str) -> str:
    """The response minus its <information> blocks (inserted by the system, not generated)."""
    out, rest = [], text
    while "<information>" in rest:
        head, _, tail = rest.partition("<information>")
        out.append(head)
        rest = tail.partition("</information>")[2]
    return "".join(out) + rest


def _timed(fn: Callable[[], object], repeats: int, before: Callable[[], None] = lambda: None) -> float:
    """Median seconds of ``repeats`` runs (``before`` runs untimed before each)."""
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    records = [r for r in read_jsonl(train_path("hotpotqa")) if len(r["paragraphs"]) >= 10][: args.batch]
    items = [_trajectory(r, right=i % 2 == 0) for i, r in enumerate(records)]
    tokens = _count_tokens([i.response for i in items])
    generated = _count_tokens([_generated_part(i.response) for i in items])
    print(f"batch: {len(items)} trajectories, {statistics.mean(tokens):.0f} tokens each on average "
          f"({statistics.mean(generated):.0f} generated, the rest retrieved), "
          f"{sum(len(i.retrieved) for i in items) // len(items)} passages each")

    scorer = RewardScorer()
    inputs = [to_input(n, item) for n, item in enumerate(items)]
    results = scorer.score_batch(inputs)
    print(f"sanity: mean EM {statistics.mean(p.exact_match for p in results):.2f} (about 0.50 expected), "
          f"mean process {statistics.mean(p.process for p in results):.2f}, "
          f"mean format {statistics.mean(p.format for p in results):.2f}")

    # Cold: the normalisation cache emptied before each run, as if every batch brought new passages.
    # Warm: passages seen before (GRPO groups, popular pages), as in the long-running server.
    cold = _timed(lambda: scorer.score_batch(inputs), args.repeats, normalize_answer.cache_clear)
    warm = _timed(lambda: scorer.score_batch(inputs), args.repeats)

    port = free_port()
    args_ = ["serve", "reward", "--port", str(port), "--metrics-port", "0", "--log-level", "WARNING"]
    log = Path(tempfile.mkdtemp()) / "reward.log"
    with ServiceProcess.ragr1("reward", args_, f"127.0.0.1:{port}", log, env={"PYTHONPATH": str(ROOT)}), \
            RewardClient(f"127.0.0.1:{port}") as client:
        client.score(items)  # warm the connection
        batched = _timed(lambda: client.score(items), args.repeats)
        per_item = _timed(lambda: [client.score([i]) for i in items], max(1, args.repeats // 2))

    n = len(items)
    print(f"\n{'path':<44}{'ms/batch':>10}{'scores/s':>12}")
    for name, seconds in [
        ("in process, cold cache", cold),
        ("in process, warm cache", warm),
        ("gRPC, one call per batch", batched),
        ("gRPC, one call per trajectory (baseline)", per_item),
    ]:
        print(f"{name:<44}{seconds * 1e3:>10.1f}{n / seconds:>12.0f}")
    print(f"\nbatched gRPC vs one call per trajectory: {per_item / batched:.1f}x faster")
    print(f"gRPC (warm server) over in process (warm): {batched / warm:.2f}x")

    generated_tokens = sum(generated)
    reward = max(cold, batched)  # the slower of a cold batch and the gRPC path
    print(f"\nrollout time of this batch ({generated_tokens} generated tokens) "
          f"vs reward time ({reward:.3f} s):")
    for name, rate in ROLLOUT_TOKENS_PER_SECOND.items():
        rollout = generated_tokens / rate
        print(f"  {name} at {rate:.0f} tokens/s: rollout {rollout:.0f} s; reward = "
              f"{100 * reward / rollout:.4f}% of the rollout time (target < 1%)")
    print(f"  reward stays under 1% until rollouts exceed {generated_tokens / (100 * reward):,.0f} "
          "generated tokens/s")


if __name__ == "__main__":
    main()
