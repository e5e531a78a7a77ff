"""Trainer throughput on this machine: SFT and PPO training tokens/s for SmolLM2-135M, and the time the
Redis queue adds to one PPO step.

Baselines measured in the same run: float32 full fine-tuning (against bfloat16 autocast and LoRA), and
the PPO update alone (against the whole loop step: feed prompts, read rollouts, update, checkpoint,
acknowledge).

    python bench/trainer/throughput.py [--sequences 4] [--response-tokens 128] [--steps 1]
                                       [--variants "bf16 full,fp32 full"] [--no-queue] [--json PATH]

Each variant's PPO update is also printed as a share of its SFT step's tokens/s (PPO/SFT): an update
costs about 22/8 of a step's FLOPs per token (bench/gpu/mfu.py), so about 0.36 is what the arithmetic allows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from ragr1.model_paths import prepare_policy_model
from ragr1.protocol.information import TOKENS_PER_QUERY, TOP_K, InformationFormat
from ragr1.protocol.prompts import Mode
from ragr1.services.common.redis_server import RedisServer
from ragr1.services.common.streams import ROLLOUTS, StreamQueue
from ragr1.services.trainer import data
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import PPOConfig, PPOSettings, SFTConfig
from ragr1.services.trainer.loop.ppo_loop import PPOLoop
from ragr1.services.trainer.model import PolicyModel, native_bf16
from ragr1.services.trainer.sft import SFTTrainer
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import PPOUpdater, Sample
from ragr1.shipped import train_path
from ragr1.v1 import common_pb2

VARIANTS = {  # name -> (bf16, lora rank)
    "fp32 full": (False, 0),
    "fp32 LoRA r16": (False, 16),
    "bf16 full": (True, 0),
    "bf16 LoRA r16": (True, 16),
}


def sft_tokens_per_second(
    model_dir: Path, sequences: list[data.TokenSequence], bf16: bool, lora: int, steps: int
) -> float:
    config = SFTConfig(model=str(model_dir), bf16=bf16, lora_rank=lora, micro_batch_size=4, lr=1e-5)
    trainer = SFTTrainer(config, PolicyModel(model_dir, lora_rank=lora, bf16=bf16))
    trainer.step(sequences[:2])  # warm-up
    start = time.perf_counter()
    tokens = sum(trainer.step(sequences)["tokens"] for _ in range(steps))
    return tokens / (time.perf_counter() - start)


def rollout_samples(tokenizer: object, count: int, response_tokens: int) -> list[Sample]:
    """Real prompts, with a response of the given length (a third of it an inserted, masked block)."""
    tasks = data.load_qa_tasks(train_path("hotpotqa"), "multi", limit=count)
    generator = torch.Generator().manual_seed(0)
    out = []
    for i, task in enumerate(tasks):
        prompt = data.render_prompt_ids(tokenizer, task.question, Mode.MULTI)  # type: ignore[arg-type]
        response = torch.randint(100, 40000, (response_tokens,), generator=generator).tolist()
        third = response_tokens // 3
        mask = [1] * third + [0] * third + [1] * (response_tokens - 2 * third)
        out.append(
            Sample(
                task.id,
                data.TokenSequence(prompt, response, mask),
                float(i % 2),
                behaviour_logprobs=[-2.0 if m else 0.0 for m in mask],
            )
        )
    return out


def ppo_tokens_per_second(model_dir: Path, samples: list[Sample], bf16: bool, lora: int, steps: int) -> float:
    settings = PPOSettings(bf16=bf16, lora_rank=lora, micro_batch_size=4)
    updater = PPOUpdater.build(settings, model_dir)
    updater.update(samples[:2])  # warm-up
    start = time.perf_counter()
    tokens = sum(updater.update(samples)["tokens"] for _ in range(steps))
    return tokens / (time.perf_counter() - start)


def queue_overhead(model_dir: Path, samples: list[Sample], steps: int) -> tuple[float, float]:
    """(seconds of queue work per step, seconds of update per step) for the loop on a real Redis."""
    with RedisServer() as server, tempfile.TemporaryDirectory() as out:
        client = server.client()
        rollouts = [
            common_pb2.Rollout(
                id=f"{s.id}-{n}",
                task_id=s.id,
                prompt_token_ids=s.sequence.prompt_ids,
                response_token_ids=s.sequence.response_ids,
                loss_mask=s.sequence.loss_mask,
                behaviour_logprobs=s.behaviour_logprobs or [],
                reward=common_pb2.RewardParts(total=s.score),
                sampling=common_pb2.SamplingParams(temperature=s.temperature, top_p=1.0),
            )
            for n in range(steps)
            for s in samples
        ]
        StreamQueue(client, ROLLOUTS, common_pb2.Rollout, group="trainer").produce(rollouts)
        tasks = data.load_qa_tasks(train_path("hotpotqa"), "multi", limit=8)
        # The loop's settings. The updater below has its own (mini-batches of 4): mini_batch_size here only has
        # to divide batch_size, as the config checks.
        config = PPOConfig(
            batch_size=len(samples),
            mini_batch_size=len(samples),
            max_staleness=steps,
            max_updates=steps,
            poll_ms=100,
            consumer="bench",
        )
        loop = PPOLoop(
            config,
            client,
            tasks,
            PPOUpdater.build(PPOSettings(lora_rank=16, micro_batch_size=4), model_dir),
            Checkpointer(Path(out) / "checkpoints"),
            StepLog(Path(out) / "steps.jsonl"),
        )
        loop.run()
        records = loop.steps.read()
    queue = sum(r["queue_seconds"] for r in records) / len(records)
    update = sum(r["update_seconds"] for r in records) / len(records)
    return queue, update


def own_paragraphs(questions: int, information: InformationFormat) -> list[data.SFTTrajectory]:
    """SFT trajectories of the first HotpotQA questions whose every query gets the question's own paragraphs,
    the named one first (what the stack's retriever returns for a name, near enough for timing: SFT's real
    trajectories search a running retriever)."""
    from ragr1.protocol.information import Passage
    from ragr1.protocol.trajectories import Searcher, names
    from ragr1.shipped import read_jsonl

    out = []
    for item, record in zip(data.load_supported_questions(train_path("hotpotqa"), questions),
                            read_jsonl(train_path("hotpotqa"), questions), strict=True):
        paragraphs = [Passage("", p["title"], p["text"]) for p in record["paragraphs"]]
        for mode in (Mode.SINGLE, Mode.MULTI):
            s = Searcher(item, mode, information)
            while queries := s.queries():
                s.read(queries, [sorted(paragraphs, key=lambda p: q not in names(p.title))[:TOP_K] for q in queries])
            pieces = s.pieces()
            if pieces is not None:
                out.append(data.SFTTrajectory(item.question, mode, pieces))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=4, help="sequences per step")
    parser.add_argument("--response-tokens", type=int, default=128, help="PPO response length")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default all)")
    parser.add_argument("--no-queue", action="store_true", help="leave out the queue measurement")
    parser.add_argument("--json", type=Path, help='also write the tokens/s here: {"sft": {variant: rate}, "ppo": ...}')
    parser.add_argument("--emulated-bf16", action="store_true",
                        help="time the bf16 rows on a CPU without native bfloat16 too (tens of times slower)")
    args = parser.parse_args()
    # Emulated bfloat16 runs for many minutes a step (docs/results/2026-11-26-bf16-avx2.md): measured on request.
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown or not chosen:
        parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(VARIANTS)}")
    variants = {name: VARIANTS[name] for name in chosen
                if not VARIANTS[name][0] or args.emulated_bf16 or native_bf16(torch.device("cpu"))}
    torch.manual_seed(0)
    model_dir = prepare_policy_model()
    tokenizer = PolicyModel(model_dir).tokenizer
    print(f"torch threads: {torch.get_num_threads()}, cores: {os.cpu_count()}")
    if len(variants) < len(chosen):
        print("no native bfloat16 on this CPU: the bf16 rows are left out (--emulated-bf16 times them)")
    information = InformationFormat(tokenizer, TOKENS_PER_QUERY)  # type: ignore[arg-type]
    sft_sequences = data.tokenize_trajectories(tokenizer, own_paragraphs(args.sequences // 2, information))
    mean_len = sum(len(s.prompt_ids) + len(s.response_ids) for s in sft_sequences) / len(sft_sequences)
    print(f"\nSFT: {len(sft_sequences)} trajectories per step, {mean_len:.0f} tokens each")
    base = None
    sft_rates = {}
    first = next(iter(variants))
    for name, (bf16, lora) in variants.items():
        rate = sft_tokens_per_second(model_dir, sft_sequences, bf16, lora, args.steps)
        base = base or rate
        sft_rates[name] = rate
        print(f"  {name:14s} {rate:7.1f} tokens/s  ({rate / base:.2f}x {first})")
    samples = rollout_samples(tokenizer, args.sequences, args.response_tokens)
    mean_len = sum(len(s.sequence.prompt_ids) + len(s.sequence.response_ids) for s in samples) / len(samples)
    print(
        f"\nPPO (defaults: separate critic, k1 KL in the reward, 4 rollouts per mini-batch): {len(samples)} rollouts, "
        f"{mean_len:.0f} tokens each"
    )
    base = None
    ppo_rates = {}
    for name, (bf16, lora) in variants.items():
        rate = ppo_tokens_per_second(model_dir, samples, bf16, lora, args.steps)
        base = base or rate
        ppo_rates[name] = rate
        print(f"  {name:14s} {rate:7.1f} tokens/s  ({rate / base:.2f}x {first}; PPO/SFT {rate / sft_rates[name]:.3f})")
    if args.json:
        args.json.write_text(json.dumps({"sft": sft_rates, "ppo": ppo_rates}))
    if args.no_queue:
        return
    queue, update = queue_overhead(model_dir, samples, args.steps)
    print(
        f"\nQueue per PPO step (LoRA, the trainer's precision): {queue * 1000:.1f} ms of queue work against "
        f"{update:.1f} s of update "
        f"= {100 * queue / update:.2f}% added (target < 5%)"
    )


if __name__ == "__main__":
    main()
