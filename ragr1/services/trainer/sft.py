"""The format-learning stage: cross-entropy on think-then-search trajectories, ``<information>`` masked."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ragr1 import shipped
from ragr1.model_paths import policy_checkpoint
from ragr1.protocol.information import InformationFormat
from ragr1.services.trainer import data, ppo_math, sft_search
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir
from ragr1.services.trainer.config import SFTConfig
from ragr1.services.trainer.model import PolicyModel, collate, init_torch, training_device
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.stepstats import numbers

log = logging.getLogger(__name__)


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, denominator: float | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the generated tokens; inserted tokens contribute nothing."""
    return -ppo_math.masked_mean(logprobs, mask, denominator)


def record_data(out: Path, trajectories: Sequence[data.SFTTrajectory], searched: list[dict[str, object]]) -> None:
    """``sft_data.json``: what SFT trains on, by source, question type and mode (trajectories, mean search
    rounds and queries), and what the search built and kept; the trajectories themselves in
    ``sft_trajectories.jsonl``."""
    groups: dict[tuple[str, str, str], list[data.SFTTrajectory]] = {}
    for t in trajectories:
        groups.setdefault((t.source, t.question_type, t.mode.value), []).append(t)
    trained = [{"source": s, "question_type": q, "mode": m, "trajectories": len(ts),
                "rounds": sum(t.rounds for t in ts) / len(ts), "queries": sum(t.queries for t in ts) / len(ts)}
               for (s, q, m), ts in sorted(groups.items())]
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft_data.json").write_text(json.dumps({"trained": trained, "searched": searched}, indent=2) + "\n")
    with open(out / "sft_trajectories.jsonl", "w", encoding="utf-8") as handle:
        for t in trajectories:
            handle.write(json.dumps(t.to_record(), ensure_ascii=False) + "\n")


class SFTTrainer:
    def __init__(self, config: SFTConfig, model: PolicyModel | None = None) -> None:
        self.config = config
        init_torch(config)
        device = training_device(config.device)  # before a model is loaded
        self.model = model or PolicyModel(
            policy_checkpoint(config.model), lora_rank=config.lora_rank, lora_alpha=config.lora_alpha,
            bf16=config.bf16, gradient_checkpointing=config.gradient_checkpointing, device=device,
        )
        # bf16 and every weight trained: the weights in bfloat16, float32 masters for the optimiser (precision).
        self.model.hold_weights_in_compute_dtype()
        # Fused: one operator per step instead of several per parameter (a launch each on a GPU).
        self.optimizer = torch.optim.AdamW(
            self.model.optimizer_parameters(), lr=config.lr, weight_decay=0.0, fused=True
        )

    def build_trajectories(self) -> list[data.SFTTrajectory]:
        """From trajectories ``ragr1 data prepare`` wrote, or searched now through the retriever for the
        questions of QA files with supporting paragraphs (``sft_search``). What was built and kept, by source,
        question type and mode, goes to ``sft_data.json`` beside the checkpoints."""
        c = self.config
        trajectories: list[data.SFTTrajectory] = []
        tokenizer: Any = self.model.tokenizer
        information = InformationFormat(tokenizer, c.tokens_per_query)
        searched: list[dict[str, object]] = []
        for name in c.train_files:
            path = shipped.train_source(name)
            if data.is_trajectory_file(path):
                trajectories += data.load_trajectories(path, c.limit or None)
                continue
            items = data.load_supported_questions(path, c.limit or None)
            result = sft_search.search_through(
                c.retriever_address, items, c.modes, information, top_k=c.top_k, max_rounds=c.max_turns,
                what=f"{path}: its SFT trajectories",
            )
            trajectories += result.trajectories
            searched += result.summary()
        record_data(Path(c.output_dir), trajectories, searched)
        return trajectories

    def build_sequences(self) -> list[data.TokenSequence]:
        return data.tokenize_trajectories(self.model.tokenizer, self.build_trajectories())

    def step(self, sequences: Sequence[data.TokenSequence]) -> dict[str, float]:
        """One optimiser step over ``sequences`` (gradients accumulated over micro-batches)."""
        c = self.config
        self.model.train()
        self.model.begin_gradients()
        self.optimizer.zero_grad(set_to_none=False)
        batch = collate(sequences, self.model.pad_id)
        denominator = float(batch.mask.sum().clamp(min=1))  # the CPU batch's: no wait on the device
        # The loss is summed on the device and read once with the gradient norm: a read per micro-batch would
        # make the host wait for the device each time.
        total: torch.Tensor | float = 0.0
        for start in range(0, len(batch), c.micro_batch_size):
            # On the model's device before the forward, which then finds it there: the loss needs the mask
            # beside the log-probs.
            micro = batch.select(range(start, min(len(batch), start + c.micro_batch_size))).to(self.model.device)
            out = self.model(micro)
            loss = sft_loss(out.logprobs, micro.mask, denominator)
            loss.backward()
            self.model.accumulate_gradients()
            total = total + loss.detach()
        grad_norm = self.model.clip_gradients(c.max_grad_norm)
        self.optimizer.step()
        self.model.publish_weights()
        return numbers({"loss": total, "grad_norm": grad_norm, "tokens": float(batch.attention_mask.sum())})

    def train(
        self,
        sequences: Sequence[data.TokenSequence] | None = None,
        on_step: Callable[[dict[str, float]], None] | None = None,
    ) -> Path:
        """Trains for ``epochs`` and writes one checkpoint; returns the directory the policy loads."""
        c = self.config
        sequences = list(sequences if sequences is not None else self.build_sequences())
        if not sequences:
            raise ValueError("no SFT trajectories: check train_files and limit")
        rng = random.Random(c.seed)
        out = Path(c.output_dir)
        steps = StepLog(out / "sft_steps.jsonl")
        step = 0
        for epoch in range(c.epochs):
            rng.shuffle(sequences)
            for start in range(0, len(sequences), c.batch_size):
                began = time.perf_counter()
                stats = self.step(sequences[start : start + c.batch_size])
                step += 1
                stats.update(
                    {
                        "step": step,
                        "epoch": epoch,
                        "tokens_per_second": stats["tokens"] / (time.perf_counter() - began),
                    }
                )
                steps.write(stats)
                log.info(
                    "sft step %d: loss %.4f, %.0f tokens/s", step, stats["loss"], stats["tokens_per_second"]
                )
                if on_step is not None:
                    on_step(stats)
        checkpoints = Checkpointer(out / "checkpoints", c.keep_checkpoints)
        version = (checkpoints.versions() or [0])[-1] + 1
        path = checkpoints.save(
            version, {"stage": "sft", "step": step, "trained_ids": []}, self.model.save_policy, None
        )
        steps.plot(out / "sft_curves.png", ["loss", "tokens_per_second"])
        return policy_dir(path)
