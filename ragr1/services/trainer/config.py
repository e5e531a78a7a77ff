"""The trainer's settings: one dataclass per stage. Defaults are RAG-R1's published PPO run where it
gives one (actor lr 1e-6 and critic lr 1e-5 when every weight trains, KL 0.001, clip 0.2, value clip 0.5,
entropy 0.001, γ = λ = 1); the policy's loop settings (max 4 turns, top-k 3) live in the policy's config."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, get_args

from ragr1.protocol.prompts import MAX_TURNS, Mode
from ragr1.services.common import ports
from ragr1.services.common.config import InformationSettings, Validated, check_at_least, check_choice, setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.common.streams import QueueConfig

# The KL estimators ppo.kl_penalty implements (this module stays free of torch: the CLI imports it).
KLKind = Literal["k1", "k3"]
KL_KINDS: tuple[str, ...] = get_args(KLKind)
# Where the networks train; model.training_device resolves "auto" and checks that a GPU is there.
DEVICES = ("auto", "cpu", "cuda")
SHARDINGS = ("fsdp", "replicate")


# The trainer's exit code when dynamic sampling found no group to train on: the end of the signal, not a failure
# (1): the updates before it are checkpointed and announced, and a supervisor such as the demo evaluates them.
NO_SIGNAL_EXIT_CODE = 3


@dataclasses.dataclass
class ModelSettings(Validated):
    help_group: ClassVar[str] = "model"

    model: str = setting("", "starting checkpoint (Hugging Face dir); empty: SmolLM2-135M-Instruct from its package")
    lora_alpha: int = setting(32, "LoRA alpha (scale = alpha / rank)")
    bf16: bool | None = setting(
        None,
        "bfloat16 autocast; unset: on where the hardware computes bfloat16 (a CUDA GPU that supports it, a CPU "
        "with AVX-512 BF16 or AMX), off elsewhere, where emulated bfloat16 trains many times slower than float32",
    )
    max_grad_norm: float = setting(1.0, "gradient clipping by global norm")
    micro_batch_size: int = setting(4, "sequences per forward/backward (gradients accumulate over the batch)")
    seed: int = setting(0, "random seed")
    # The local stack sets it where the trainer shares its cores with vLLM (stack/wiring.trainer_threads
    # says why); 0 suits a trainer with cores of its own.
    threads: int = setting(0, "torch CPU threads; 0 = one per core (torch's default)")
    device: str = setting(
        "auto", "where the networks train: auto (CUDA when torch sees a GPU, else the CPU), cpu or cuda"
    )
    output_dir: str = setting("runs/trainer", "checkpoints (v000001, …), steps.jsonl and curves.png go here")
    keep_checkpoints: int = setting(3, "how many recent checkpoint versions to keep on disk")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("micro_batch_size", 1), ("threads", 0)))
        check_choice("device", self.device, DEVICES)


@dataclasses.dataclass
class SFTConfig(InformationSettings, ModelSettings):
    lora_rank: int = setting(0, "LoRA rank; 0 trains every weight (RAG-R1's SFT)")
    gradient_checkpointing: bool = setting(
        False, "recompute each layer's activations in the backward pass (less memory, ~1.3x compute)"
    )
    # setting(..., factory=True) builds a default_factory field, which is what RUF009 asks for.
    train_files: list[str] = setting(
        lambda: ["hotpotqa"], "training sets (shipped names or JSONL paths) with supporting paragraphs", factory=True
    )
    modes: list[str] = setting(
        lambda: ["single", "multi"], "trajectory variants: single, multi (and none: answer without search)",
        factory=True,
    )
    limit: int = setting(64, "questions per training set")
    # A QA file's trajectories search the retriever as rollouts do; a prepared trajectories file needs none.
    retriever_address: str = setting(
        f"127.0.0.1:{ports.RETRIEVER}", "Retriever (router) gRPC address the SFT trajectories of QA files search"
    )
    max_turns: int = setting(MAX_TURNS, "searches an SFT trajectory makes at most (the policy's max_turns)")
    lr: float = setting(1e-5, "learning rate")
    epochs: int = setting(1, "passes over the trajectories")
    batch_size: int = setting(8, "sequences per optimiser step")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("lora_rank", 0), ("max_turns", 0)))


# Learning rates by parameterisation. Full fine-tuning: RAG-R1's (verl's PPO run of Qwen2.5-7B). LoRA: its
# adapters start at zero (B = 0) and change the model only through a rank-r product, so at full fine-tuning's
# rates an update barely moves the policy; LoRA's best rate is known to sit one to two orders of magnitude
# above full fine-tuning's. docs/fidelity.md has what was measured here.
FULL_ACTOR_LR = 1e-6
FULL_CRITIC_LR = 1e-5
LORA_ACTOR_LR = 1e-4
LORA_CRITIC_LR = 1e-4


def _rate_help(model: str, full: float, lora: float) -> str:
    return (
        f"{model} learning rate; None (unset): {full:.0e} when every weight trains (--lora-rank 0, RAG-R1's), "
        f"{lora:.0e} with LoRA (its adapters start at zero and move the model through a low-rank product: full "
        "fine-tuning's rate barely moves them)"
    )


@dataclasses.dataclass
class PPOSettings(ModelSettings):
    """The update itself (what a Ray worker needs, too)."""

    # RAG-R1 fine-tunes every weight on GPUs; on CPUs LoRA is what fits (bench/trainer/memory.py measures it).
    lora_rank: int = setting(16, "LoRA rank of the actor and of the critic's own adapter; 0 trains every weight")
    actor_lr: float | None = setting(None, _rate_help("actor", FULL_ACTOR_LR, LORA_ACTOR_LR))
    critic_lr: float | None = setting(None, _rate_help("critic", FULL_CRITIC_LR, LORA_CRITIC_LR))
    actor_warmup_ratio: float = setting(
        0.285, "share of max_updates over which the actor's learning rate ramps up linearly (0 = none)"
    )
    critic_warmup_ratio: float = setting(0.015, "the same for the critic")
    weight_decay: float = setting(0.01, "AdamW weight decay of the actor")
    critic_weight_decay: float = setting(0.01, "AdamW weight decay of the critic")
    critic_max_grad_norm: float = setting(1.0, "gradient clipping of the critic by global norm")
    max_updates: int = setting(10, "stop after this many updates (0 = run until stopped, and no warm-up)")
    mini_batch_size: int = setting(4, "rollouts per optimiser step; batch_size / mini_batch_size steps per update")
    ppo_epochs: int = setting(1, "passes over each batch (each pass takes one step per mini-batch)")
    shuffle_mini_batches: bool = setting(False, "shuffle the rollouts before splitting them into mini-batches")
    micro_batch_tokens: int = setting(
        8192, "most tokens (rows x longest row) per forward/backward; 0 = micro_batch_size alone decides"
    )
    forward_micro_batch_tokens: int = setting(
        16384,
        "most tokens per micro-batch of the no-gradient passes (old and reference log-probs, values, the "
        "likelihood check; verl's log_prob_max_token_len_per_gpu), whatever its rows: they keep no activations; "
        "0 = as training's",
    )
    logit_chunk_tokens: int = setting(
        1024, "positions per chunk of the vocabulary projection (its [positions x vocab] tensors are the bulk)"
    )
    # A rollout's update is long sequences at small batch: checkpointing is what fits (bench/trainer/memory.py).
    gradient_checkpointing: bool = setting(
        True, "recompute each layer's activations in the backward pass (less memory, ~1.3x compute; on for "
        "PPO's long rollouts)"
    )
    kl_coef: float = setting(0.001, "KL-to-reference coefficient; 0 skips the reference pass")
    kl_penalty: str = setting(
        "auto",
        "where the KL goes: reward (subtracted from the token rewards: RAG-R1's PPO) or loss (verl's GRPO); "
        "auto: reward with advantage=gae, loss with grpo",
    )
    kl_kind: str = setting(
        "auto",
        "KL estimator: k1 (RAG-R1's) or k3 (low variance, >= 0; verl's GRPO); auto: k1 in the reward, k3 in the loss",
    )
    clip: float = setting(0.2, "policy ratio clip")
    # DAPO's clip-higher: a symmetric clip caps how fast an unlikely token of a rewarded sample can grow,
    # which is how entropy collapses; a higher upper bound lets exploration survive.
    clip_high: float = setting(
        0.0, "upper policy ratio clip, the ratio kept within [1 - clip, 1 + clip_high] (DAPO: 0.28); 0 = clip"
    )
    value_clip: float = setting(0.5, "value clip around the old values")
    entropy_coef: float = setting(0.001, "entropy bonus coefficient")
    gamma: float = setting(1.0, "discount")
    lam: float = setting(1.0, "GAE lambda")
    advantage: str = setting("gae", "gae (critic) or grpo (group-relative, no critic)")
    whiten_advantages: bool = setting(True, "normalise GAE advantages over the batch")
    tis_cap: float = setting(2.0, "truncation of the behaviour importance weight (decoupled PPO)")
    sharding: str = setting(
        "fsdp",
        "how Ray workers (num_workers > 1) hold the models: fsdp (each a shard of the weights, gradients and "
        "optimiser state, as verl runs RAG-R1) or replicate (each a whole copy, gradients all-reduced)",
    )

    @property
    def uses_critic(self) -> bool:
        return self.advantage == "gae"

    @property
    def actor_learning_rate(self) -> float:
        """``actor_lr``, or the default of the parameterisation (LoRA or every weight)."""
        if self.actor_lr is not None:
            return self.actor_lr
        return LORA_ACTOR_LR if self.lora_rank > 0 else FULL_ACTOR_LR

    @property
    def critic_learning_rate(self) -> float:
        """``critic_lr``, or the default of the parameterisation (the critic's own LoRA adapter or every weight)."""
        if self.critic_lr is not None:
            return self.critic_lr
        return LORA_CRITIC_LR if self.lora_rank > 0 else FULL_CRITIC_LR

    @property
    def kl_in_reward(self) -> bool:
        """Whether the KL is subtracted from the token rewards (else it is a loss term)."""
        return self.advantage == "gae" if self.kl_penalty == "auto" else self.kl_penalty == "reward"

    @property
    def kl_estimator(self) -> str:
        if self.kl_kind != "auto":
            return self.kl_kind
        return "k1" if self.kl_in_reward else "k3"

    def warmup_updates(self, ratio: float) -> int:
        """Warm-up length in updates (verl's int(ratio × total steps)); none when the run is unbounded."""
        return int(ratio * self.max_updates) if self.max_updates > 0 else 0

    def validate(self) -> None:
        for name, choices in (
            ("advantage", ("gae", "grpo")),
            ("kl_penalty", ("auto", "reward", "loss")),
            ("kl_kind", ("auto", *KL_KINDS)),
            ("sharding", SHARDINGS),
        ):
            check_choice(name, getattr(self, name), choices)
        super().validate()
        check_at_least(self, (
            ("lora_rank", 0), ("mini_batch_size", 1), ("ppo_epochs", 1), ("logit_chunk_tokens", 1),
            ("micro_batch_tokens", 0), ("forward_micro_batch_tokens", 0), ("max_updates", 0),
        ))
        if self.advantage == "grpo" and self.kl_penalty == "reward" and self.kl_coef > 0:
            # Refused rather than warned: such a run learns from noise while its rewards say nothing happened.
            raise ValueError(
                "kl_penalty=reward with advantage=grpo: GRPO divides each group's summed rewards by their "
                "spread, so a group whose samples all scored the same would get unit-size advantages from the "
                "KL term's noise; use kl_penalty=loss (verl's GRPO) or auto"
            )
        for name in ("actor_warmup_ratio", "critic_warmup_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.clip_high < 0:
            raise ValueError(f"clip_high must be >= 0 (0: the same as clip), got {self.clip_high}")
        for name in ("actor_lr", "critic_lr", "clip", "value_clip", "tis_cap"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclasses.dataclass
class HealthSettings(Validated):
    """The training-health alarms (``health``): the trainer logs a warning naming the alarm and the
    update, and exports each threshold as ``ragr1_trainer_alarm_threshold{alarm}``, which the alert rules
    (deploy/prometheus/alerts.yml) compare against, so that the log and the alerts fire on the same value."""

    # Set well above the gap that numerics alone leave between the trainer (bf16 autocast) and vLLM (fp32) on
    # the same weights, and well below that of other weights; tests/policy/test_engine.py checks both
    # against the real engine.
    logprob_gap_threshold: float = setting(
        0.1,
        "weight-sync alarm: mean |trainer - vLLM| log-prob per generated token (nats) of the rollouts "
        "sampled at the trainer's version or one behind, above which the policy probably serves other weights",
    )
    likelihood_falling_updates: int = setting(
        3,
        "likelihood-displacement alarm: this many updates in a row that lowered the mean per-token "
        "log-likelihood of the rollouts they reinforced (positive advantage); 0 = off",
    )
    entropy_floor: float = setting(
        0.1, "entropy-collapse alarm: mean policy entropy over generated tokens (nats) below this; 0 = off"
    )
    kl_ceiling: float = setting(
        0.5, "KL alarm: mean KL to the reference per generated token (nats) above this; 0 = off"
    )

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("likelihood_falling_updates", 0),))
        if self.logprob_gap_threshold <= 0:
            raise ValueError(f"logprob_gap_threshold must be positive, got {self.logprob_gap_threshold}")
        for name in ("entropy_floor", "kl_ceiling"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0 (0 = off), got {getattr(self, name)}")


@dataclasses.dataclass
class PPOConfig(PPOSettings, HealthSettings, ServerConfig, QueueConfig):
    port: int = setting(ports.TRAINER, "gRPC port of the Trainer.Status service; 0 picks a free one")
    group: str = setting("trainer", "consumer group on the rollouts stream")
    consumer: str = setting("trainer-0", "consumer name; a restart with the same name resumes its pending")
    prompts_file: str = setting("", "QA JSONL or Search-R1 parquet of prompts; empty = train/hotpotqa")
    prompt_limit: int = setting(0, "use only the first N prompts; 0 = all")
    mode: str = setting("multi", "search mode of the prompts: single, multi or none (no retrieval)")
    samples_per_prompt: int = setting(
        1, "rollouts per prompt, trained together in one batch (at least 2 with advantage=grpo)"
    )
    batch_size: int = setting(16, "rollouts per update")
    max_uniform_groups: int = setting(
        0,
        "dynamic sampling (DAPO's) and its bound: a batch takes only groups whose samples scored differently, "
        "and prompts are sampled until a batch of them is in or this many groups of equal scores were skipped "
        "for the update (it then trains the ones it has; with none, training stops, as DAPO's does, with exit "
        f"code {NO_SIGNAL_EXIT_CODE}, its checkpoints kept); 0 trains every group (RAG-R1's)",
    )
    max_staleness: int = setting(1, "drop rollouts more than this many versions behind the trainer")
    start_version: int = setting(
        0, "version the starting weights (model) are announced as; 1 after an SFT checkpoint announced as v1"
    )
    poll_ms: int = setting(1000, "longest wait for rollouts per read")
    fleet_poll_seconds: float = setting(
        5.0,
        "how often the policy replicas' reports (while collecting) and the prompts backlog are read from Redis "
        "(the fleet metrics, the check of weights_timeout_seconds, the autoscaler's gauges)",
    )
    trim_streams: bool = setting(
        True, "after each update, delete the prompts and rollouts every group is done with (Redis stays bounded)"
    )
    weights_timeout_seconds: float = setting(
        600.0,
        "stop with an error when policy replicas report in Redis but none has served the newest announced "
        "weight version for this long (a replica that refused it tries again, so a refusal alone stops nothing)",
    )
    # Longer than a replica of the chart takes to come up from nothing (scheduling, an engine load its startup
    # probe allows 15 minutes, the first weights), so that a fleet woken from zero does not set it off.
    prompts_stranded_seconds: float = setting(
        1200.0,
        "prompts-stranded alarm: prompts waiting or in progress while no policy replica takes prompts (none "
        "reports serving: a replica loading a version, or retrying one it refused, takes none) for this long; "
        "0 = off",
    )
    num_workers: int = setting(1, "data-parallel workers; > 1 runs each update under Ray Train")

    def validate(self) -> None:
        super().validate()
        check_choice("mode", self.mode, [m.value for m in Mode])
        check_at_least(self, (
            ("batch_size", 1), ("samples_per_prompt", 1), ("num_workers", 1), ("max_staleness", 0),
            ("max_uniform_groups", 0),
        ))
        for name in ("fleet_poll_seconds", "weights_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.prompts_stranded_seconds < 0:
            raise ValueError(f"prompts_stranded_seconds must be at least 0 (0 = off), got "
                             f"{self.prompts_stranded_seconds}")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of mini_batch_size ({self.mini_batch_size})"
            )
        if self.batch_size % self.samples_per_prompt:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of samples_per_prompt "
                f"({self.samples_per_prompt}): a batch holds whole groups of samples of one prompt"
            )
        if self.advantage == "grpo" and self.samples_per_prompt < 2:
            raise ValueError(
                f"advantage=grpo needs samples_per_prompt of at least 2 (got {self.samples_per_prompt}): "
                "a group of one has no relative advantage"
            )
        if self.max_uniform_groups > 0 and self.samples_per_prompt < 2:
            raise ValueError(
                f"max_uniform_groups needs samples_per_prompt of at least 2 (got {self.samples_per_prompt}): "
                "only a group of samples can score uniformly"
            )
