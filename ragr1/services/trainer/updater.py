"""One PPO update on a batch of rollouts: the model-facing half of PPO (the arithmetic is in ``ppo``).

As RAG-R1 runs it (verl): ``prepare`` runs the no-gradient passes (proximal log-probs, reference
log-probs, values), puts the KL penalty into the token rewards and computes advantages for the whole
batch; then the batch is split into mini-batches and every mini-batch is one clipped optimiser step of
the critic and one of the actor (``batch_size / mini_batch_size`` steps each per epoch), so that from the
second mini-batch on the policy has moved and the ratio can leave [1 - ε, 1 + ε]. The two models have
their own AdamW, learning rate with warm-up, weight decay and gradient clip.

Within a mini-batch, gradients accumulate over micro-batches capped in rows and tokens; every loss is
divided by the mini-batch's token count, so data-parallel workers that each take a share of its rows
and sum their gradients (``reduce``) take exactly the step one process would take.

Devices: the batch's rows are chosen on the CPU, where it was built; every per-token tensor (log-probs,
values, advantages, losses) and every statistic (``StepStats``, the gradient norms) stays on the models'
device, and the numbers the update reports are read from it once, at its end. A read in the loop would
make the host wait for the device each micro-batch, leaving the GPU idle while the next one is queued.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ragr1.services.trainer import fsdp, ppo_math
from ragr1.services.trainer.config import PPOSettings
from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.model import (
    Batch,
    PolicyModel,
    ValueModel,
    _named_trainable,
    collate,
    micro_batches,
    training_device,
)
from ragr1.services.trainer.stepstats import Reduce, StepStats, numbers
from ragr1.services.trainer.update_parts import Optimised, Prepared

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Sample:
    """One trajectory to learn from: its tokens, how it scored, and what sampled it."""

    id: str
    sequence: TokenSequence
    score: float
    group_id: str = ""
    # Per response token, under the policy that generated it; None = on-policy (the trainer's own).
    behaviour_logprobs: list[float] | None = None
    # The temperature it was sampled at: the trainer's log-probs divide the logits by it.
    temperature: float = 1.0
    # How many updates the trainer's weights are ahead of the ones that sampled it (0: the same
    # version); None: unknown. With lag 0, or lag 1 while the updater holds the weights before its last
    # update, the trainer's log-probs must match the behaviour ones: the weight-sync check.
    weights_lag: int | None = None


class PPOUpdater:
    def __init__(self, settings: PPOSettings, actor: PolicyModel, critic: ValueModel | None = None) -> None:
        if settings.uses_critic and critic is None:
            raise ValueError("advantage=gae needs a critic (ValueModel)")
        if settings.kl_coef > 0 and actor.reference is None and not actor.lora:
            raise ValueError("kl_coef > 0 needs a reference policy: build the actor with with_reference=True")
        self.settings = settings
        self.actor = actor
        self.critic = critic if settings.uses_critic else None
        # Updates taken so far: drives the warm-up and the shuffling seed; saved with the state.
        self.updates = 0
        # The actor's trainable weights before the last update: with asynchronous rollouts most of a batch was
        # sampled a version behind, and the weight-sync check compares those under the weights that sampled
        # them. A CPU state dict (the LoRA adapters by default), or, where the actor holds bfloat16 weights with
        # masters, one copy of their flat buffer (``_previous_buffer`` says where). Not saved: after a restart
        # only rollouts of the current version are checked until the next update.
        self.previous_actor: dict[str, torch.Tensor] | torch.Tensor | None = None
        # FSDP: the gradients are reduce-scattered in the backward, and every worker must run as many
        # forward passes as the others (each pass gathers weights from all of them).
        self.sharded = any(fsdp.is_sharded(p) for p in actor.actor_parameters())
        if not self.sharded:
            # bf16 and every weight trained: the weights in bfloat16, float32 masters for the optimisers.
            actor.hold_weights_in_compute_dtype()
            if self.critic is not None:
                self.critic.hold_weights_in_compute_dtype()
        # AdamW's fused step: one operator per step instead of several per parameter (a launch each on a GPU).
        fused = True if not self.sharded else None
        self.parts = [
            Optimised(
                "actor",
                actor.optimizer_parameters(),
                torch.optim.AdamW(
                    actor.optimizer_parameters(), lr=settings.actor_learning_rate, weight_decay=settings.weight_decay,
                    fused=fused,
                ),
                settings.actor_learning_rate,
                settings.warmup_updates(settings.actor_warmup_ratio),
                settings.max_grad_norm,
            )
        ]
        if self.critic is not None:
            params = self.critic.optimizer_parameters()
            self.parts.append(
                Optimised(
                    "critic",
                    params,
                    torch.optim.AdamW(
                        params, lr=settings.critic_learning_rate, weight_decay=settings.critic_weight_decay,
                        fused=fused,
                    ),
                    settings.critic_learning_rate,
                    settings.warmup_updates(settings.critic_warmup_ratio),
                    settings.critic_max_grad_norm,
                )
            )

    @classmethod
    def build(
        cls, settings: PPOSettings, model_dir: Path, device: torch.device | None = None, shard: bool = False
    ) -> PPOUpdater:
        """The actor (with its reference when there is a KL term) and, for GAE, the critic, on ``device``
        (default: ``settings.device`` resolved); ``shard``: FSDP across the data-parallel workers of an
        initialised process group (``fsdp``), before the optimisers take the parameters."""
        actor = PolicyModel(
            model_dir,
            lora_rank=settings.lora_rank,
            lora_alpha=settings.lora_alpha,
            with_reference=settings.kl_coef > 0,
            bf16=settings.bf16,
            gradient_checkpointing=settings.gradient_checkpointing,
            logit_chunk_tokens=settings.logit_chunk_tokens,
            device=device or training_device(settings.device),
        )
        critic = ValueModel(actor) if settings.uses_critic else None
        if shard:
            for network in (actor, critic):
                if network is not None:
                    network.shard()
        return cls(settings, actor, critic)

    @property
    def uses_critic(self) -> bool:
        return self.critic is not None

    def _micro_batches(self, batch: Batch, rows: Sequence[int]) -> list[list[int]]:
        s = self.settings
        return micro_batches(batch, rows, s.micro_batch_size, s.micro_batch_tokens)

    def _inference(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.inference_mode`` (no autograd records at all, not even tensors' version counters): its outputs
        are inference tensors, which a loss must not keep for its backward (``prepare`` copies them). FSDP's
        hooks update the sharded weights' version counters, which inference mode refuses: no_grad there."""
        return torch.no_grad() if self.sharded else torch.inference_mode()

    def _forward_batches(self, batch: Batch, rows: Sequence[int]) -> list[list[int]]:
        """Micro-batches of a no-gradient pass: capped in tokens only (verl's dynamic batch size for log-probs)."""
        s = self.settings
        return micro_batches(batch, rows, len(rows), s.forward_micro_batch_tokens or s.micro_batch_tokens)

    @property
    def device(self) -> torch.device:
        return self.actor.device

    def _no_grad(self, batch: Batch, forward: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        """``forward`` over ``batch`` in micro-batches, without autograd (``_inference``)."""
        with self._inference():
            passes = self._forward_batches(batch, range(len(batch)))
            if len(passes) == 1:
                return forward(batch)
            out = torch.zeros(batch.mask.shape, device=self.device)
            for rows in passes:
                out[rows] = forward(batch.select(rows))
        return out

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        batch = collate([x.sequence for x in samples], self.actor.pad_id, [x.temperature for x in samples])
        with self._inference():
            prepared = self._prepare(samples, batch)
        # Out of inference mode: the losses keep some of these for their backward, which inference tensors
        # may not be.
        return dataclasses.replace(
            prepared,
            **{
                f.name: getattr(prepared, f.name).clone()
                for f in dataclasses.fields(prepared)
                if isinstance(getattr(prepared, f.name), torch.Tensor)
            },
        )

    def _prepare(self, samples: Sequence[Sample], batch: Batch) -> Prepared:
        s = self.settings
        self.actor.eval()
        mask = batch.mask.to(self.device)
        old_logprobs = self._no_grad(batch, lambda b: self.actor(b).logprobs)
        stats: dict[str, torch.Tensor | float] = {}
        kl = ref = None
        if s.kl_coef > 0:
            ref = self._no_grad(batch, self.actor.reference_logprobs)
            # verl's kl = old_log_prob - ref_log_prob, on generated tokens only.
            kl = ppo_math.kl_penalty(old_logprobs, ref, s.kl_estimator) * mask  # type: ignore[arg-type]
            stats["kl"] = ppo_math.masked_mean(kl, mask)
        behaviour = None
        if any(x.behaviour_logprobs is not None for x in samples):
            given = torch.zeros(batch.mask.shape)
            for i, x in enumerate(samples):
                if x.behaviour_logprobs is not None:
                    given[i, : len(x.behaviour_logprobs)] = torch.tensor(x.behaviour_logprobs)
            has = torch.tensor([x.behaviour_logprobs is not None for x in samples])[:, None] & (batch.mask > 0)
            behaviour = torch.where(has.to(self.device), given.to(self.device), old_logprobs)
            stats.update(self._sync_gap(samples, batch, old_logprobs, behaviour))
        scores = torch.tensor([x.score for x in samples], dtype=torch.float32, device=self.device)
        in_reward = s.kl_in_reward
        rewards = ppo_math.token_rewards(scores, mask, kl if in_reward else None, s.kl_coef)
        returns = old_values = None
        if self.critic is not None:
            self.critic.eval()
            old_values = self._no_grad(batch, self.critic)
            advantages, returns = ppo_math.gae(rewards, old_values, mask, s.gamma, s.lam)
            if s.whiten_advantages:
                advantages = ppo_math.masked_whiten(advantages, mask)
        else:
            # verl's GRPO scores a trajectory by the sum of its token rewards (KL penalty included).
            group_ids = [x.group_id or x.id for x in samples]
            advantages = ppo_math.grpo_advantages(rewards.sum(dim=1), group_ids, mask)
        return Prepared(
            batch, old_logprobs, old_values, None if in_reward else ref, behaviour, advantages, returns, scores,
            stats,
        )

    def _mini_batches(self, size: int, epoch: int) -> list[list[int]]:
        s = self.settings
        order = list(range(size))
        if s.shuffle_mini_batches:
            # Seeded by update and epoch, so that every data-parallel worker draws the same order.
            generator = torch.Generator().manual_seed(s.seed * 1_000_003 + self.updates * 1_009 + epoch)
            order = torch.randperm(size, generator=generator).tolist()
        return [order[i : i + s.mini_batch_size] for i in range(0, size, s.mini_batch_size)]

    def _actor_loss(self, prepared: Prepared, micro: Batch, sel: torch.Tensor, denominator: float) -> Any:
        s = self.settings
        out = self.actor(micro)
        micro = micro.to(self.device)

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[sel]

        return ppo_math.actor_loss(
            logprobs=out.logprobs,
            entropy=out.entropy,
            old_logprobs=prepared.old_logprobs[sel],
            behaviour_logprobs=pick(prepared.behaviour_logprobs),
            advantages=prepared.advantages[sel],
            mask=micro.mask,
            clip=s.clip,
            clip_high=s.clip_high or None,
            entropy_coef=s.entropy_coef,
            tis_cap=s.tis_cap,
            ref_logprobs=pick(prepared.ref_logprobs),
            kl_coef=s.kl_coef,
            kl_kind=s.kl_estimator,  # type: ignore[arg-type]
            denominator=denominator,
        )

    def _critic_loss(self, prepared: Prepared, micro: Batch, sel: torch.Tensor, denominator: float) -> Any:
        assert self.critic is not None and prepared.old_values is not None and prepared.returns is not None
        values = self.critic(micro)
        micro = micro.to(self.device)
        return ppo_math.value_loss(
            values,
            prepared.old_values[sel],
            prepared.returns[sel],
            micro.mask,
            self.settings.value_clip,
            denominator,
        )

    def step(
        self,
        model: str,
        prepared: Prepared,
        mini_batch: Sequence[int],
        rank: int = 0,
        world: int = 1,
        stats: StepStats | None = None,
        reduce: Reduce | None = None,
    ) -> StepStats:
        """One optimiser step of the ``"actor"`` or the ``"critic"`` on a mini-batch, of which this
        worker computes its share of the rows."""
        part = next(p for p in self.parts if p.name == model)
        loss_fn = self._actor_loss if model == "actor" else self._critic_loss
        network = self.actor if model == "actor" else self.critic
        assert network is not None
        network.train()
        stats = stats or StepStats(self.device)
        denominator = prepared.tokens(mini_batch)
        # Master weights' gradients are views of one buffer, zeroed in place.
        network.begin_gradients()
        part.optimizer.zero_grad(set_to_none=network.masters is None)
        for rows, counted in self._passes(prepared, mini_batch, rank, world, reduce):
            micro = prepared.batch.select(rows)
            sel = torch.as_tensor(rows, dtype=torch.long).to(self.device)
            loss, step_stats = loss_fn(prepared, micro, sel, denominator)
            if counted:
                stats.add(step_stats, prepared.tokens(rows), denominator)
            # FSDP averages over the workers where the step needs their sum (fsdp).
            (loss * (world if self.sharded else 1) * float(counted)).backward()
            network.accumulate_gradients()
        if reduce is not None:
            for p in part.params:
                if fsdp.is_sharded(p):
                    continue  # reduce-scattered by FSDP in the backward
                # Every worker joins every reduction, whether or not its rows reached this parameter.
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                reduce(p.grad, "sum")
        norm = network.clip_gradients(part.max_grad_norm)
        part.grad_norms.append(fsdp.whole(norm).detach())
        part.optimizer.step()
        network.publish_weights()
        return stats

    def _passes(
        self, prepared: Prepared, mini_batch: Sequence[int], rank: int, world: int, reduce: Reduce | None
    ) -> list[tuple[list[int], bool]]:
        """This worker's micro-batches of its share of ``mini_batch`` (rows, counted); rows without a
        generated token are skipped. Sharded, every worker runs as many passes as the busiest one: the
        extra ones repeat the mini-batch's longest row and count nothing."""
        mask = prepared.batch.mask
        live = [r for r in list(mini_batch)[rank::world] if float(mask[r].sum()) > 0]
        passes = [(rows, True) for rows in self._micro_batches(prepared.batch, live)]
        if not self.sharded or reduce is None:
            return passes
        most = torch.tensor([float(len(passes))], dtype=torch.float64)
        reduce(most, "max")
        filler = max(mini_batch, key=lambda r: float(mask[r].sum()))
        if float(mask[filler].sum()) == 0:
            return []  # no worker has a token to learn from in this mini-batch
        return passes + [([filler], False)] * (int(most) - len(passes))

    def _sync_gap(
        self, samples: Sequence[Sample], batch: Batch, current: torch.Tensor, behaviour: torch.Tensor
    ) -> dict[str, float]:
        """The weight-sync gap over the rows sampled by the current weights or, when they are held, by
        the weights before the last update (their log-probs computed under those)."""
        previous = self.previous_actor
        lagged = [i for i, x in enumerate(samples) if x.weights_lag == 1] if previous is not None else []
        trainer = current
        if isinstance(previous, torch.Tensor) and lagged:
            masters = self.actor.masters
            assert masters is not None
            masters.weights.copy_(previous)
            try:
                trainer = current.clone()
                trainer[lagged] = self._no_grad(batch.select(lagged), lambda b: self.actor(b).logprobs)
            finally:
                masters.publish()
        elif isinstance(previous, dict) and lagged:
            held = self.actor.trainable_state()
            self.actor.load_trainable_state(previous)
            try:
                trainer = current.clone()
                trainer[lagged] = self._no_grad(batch.select(lagged), lambda b: self.actor(b).logprobs)
            finally:
                self.actor.load_trainable_state(held)
        checked = [x.weights_lag == 0 or (previous is not None and x.weights_lag == 1) for x in samples]
        return ppo_math.logprob_gap(trainer, behaviour, batch.mask.to(self.device), checked)

    def update(
        self, samples: Sequence[Sample], rank: int = 0, world: int = 1, reduce: Reduce | None = None
    ) -> dict[str, float]:
        """prepare, then ``ppo_epochs`` passes of one critic and one actor step per mini-batch. A
        data-parallel worker passes its ``rank``, the ``world`` size and ``reduce``; it computes its
        share of each mini-batch and every worker ends with the same weights."""
        start = time.perf_counter()
        learning_rates = {f"{p.name}_lr": p.set_learning_rate(self.updates) for p in self.parts}
        prepared = self.prepare(samples)
        self._hold_previous_actor()
        stats = StepStats(self.device)
        for part in self.parts:
            part.grad_norms = []
        for epoch in range(self.settings.ppo_epochs):
            minis = self._mini_batches(len(samples), epoch)
            # verl's order: the critic's steps, then the actor's (they share no trainable weight).
            for model in [p.name for p in reversed(self.parts)]:
                for mini in minis:
                    self.step(model, prepared, mini, rank, world, stats, reduce)
        if reduce is not None:
            stats.reduce(reduce)
        likelihood = self._likelihood_change(prepared)
        self.updates += 1
        result = {**numbers(prepared.stats), **stats.result(), **learning_rates, **likelihood}
        for part in self.parts:
            norms = torch.stack(part.grad_norms).tolist() if part.grad_norms else []
            result[f"{part.name}_grad_norm"] = sum(norms) / max(1, len(norms))
            result[f"{part.name}_grad_norm_max"] = max(norms, default=0.0)
            result[f"{part.name}_steps"] = float(len(norms))
        elapsed = time.perf_counter() - start
        tokens = float(sum(len(x.sequence.prompt_ids) + len(x.sequence.response_ids) for x in samples))
        result.update(
            {
                "reward_mean": sum(x.score for x in samples) / len(samples),
                "tokens": tokens,
                "tokens_per_second": tokens / elapsed if elapsed > 0 else 0.0,
                "update_seconds": elapsed,
            }
        )
        return result

    def _hold_previous_actor(self) -> None:
        """``previous_actor``: the actor's trainable weights now. With master weights, their bfloat16 buffer in one
        copy (``_previous_buffer``). Else on the CPU; from a GPU into pinned buffers kept across updates, queued
        behind the work before it (the optimiser steps that follow it on the same stream wait for it; the host
        does not)."""
        masters = self.actor.masters
        if masters is not None:
            held = self.previous_actor
            if not isinstance(held, torch.Tensor) or held.shape != masters.weights.shape:
                held = self._previous_buffer(masters.weights)
            held.copy_(masters.weights, non_blocking=True)
            self.previous_actor = held
            return
        if self.device.type != "cuda" or self.sharded:
            self.previous_actor = self.actor.trainable_state()
            return
        held = self.previous_actor if isinstance(self.previous_actor, dict) else {}
        current = dict(_named_trainable(self.actor))
        if held.keys() != current.keys():
            held = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in current.items()}
        for name, param in current.items():
            held[name].copy_(param.detach(), non_blocking=True)
        self.previous_actor = held

    @staticmethod
    def _previous_buffer(weights: torch.Tensor) -> torch.Tensor:
        """Room for a copy of ``weights``: on their device where it leaves at least three more copies' worth free
        (the steps that follow need room for their activations), else in pinned host memory."""
        if weights.device.type != "cuda":
            return torch.empty_like(weights)
        free, _ = torch.cuda.mem_get_info(weights.device)
        if free >= 4 * weights.numel() * weights.element_size():
            return torch.empty_like(weights)
        log.info("the previous actor's weights go to host memory: the GPU has %.1f GiB free", free / 2**30)
        return torch.empty(weights.shape, dtype=weights.dtype, pin_memory=True)

    def _likelihood_change(self, prepared: Prepared) -> dict[str, float]:
        """What the update did to the rollouts it was meant to reinforce (positive advantage summed over
        their generated tokens): the mean change of their per-token log-likelihood, stepped actor minus
        the proximal log-probs ``prepare`` computed before the steps, in the same mode (an untouched actor
        gives exactly 0). Negative is likelihood displacement (the LLDS analysis of GRPO collapses): the
        update lowered what it meant to raise. Costs one no-gradient forward pass over those rollouts,
        timed in ``likelihood_check_seconds``; every data-parallel worker runs the same pass."""
        start = time.perf_counter()
        mask = prepared.batch.mask.to(self.device)
        # One read of the device: which rows to run again is a host decision.
        reinforced = torch.nonzero((prepared.advantages * mask).sum(dim=1) > 0).flatten().tolist()
        if not reinforced:
            return {}
        self.actor.eval()
        after = self._no_grad(prepared.batch.select(reinforced), lambda b: self.actor(b).logprobs)
        change = ppo_math.masked_mean(after - prepared.old_logprobs[reinforced], mask[reinforced])
        return {
            "likelihood_change": float(change),
            "likelihood_rollouts": float(len(reinforced)),
            "likelihood_check_seconds": time.perf_counter() - start,
        }

    def save_policy(self, directory: Path) -> None:
        self.actor.save_policy(directory)

    def close(self) -> None:
        """Nothing to release: one process (the Ray updater stops its workers here)."""

    def state(self) -> dict[str, Any]:
        """A snapshot: the optimisers' state_dicts hold their live tensors, so they are copied."""
        state: dict[str, Any] = {"updates": self.updates, "actor": self.actor.trainable_state()}
        if self.critic is not None:
            state["critic"] = self.critic.trainable_state()
        for part in self.parts:
            state[f"{part.name}_optimizer"] = copy.deepcopy(fsdp.full(part.optimizer.state_dict()))
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        self.actor.load_trainable_state(state["actor"])
        if self.critic is not None:
            self.critic.load_trainable_state(state["critic"])
        for part in self.parts:
            # A copy: load_state_dict keeps the given tensors as the moments and steps update them in place.
            fsdp.load_optimizer_state(part.optimizer, copy.deepcopy(state[f"{part.name}_optimizer"]))
        self.updates = int(state["updates"])

