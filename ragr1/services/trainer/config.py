"""The trainer's settings: one dataclass per stage. Defaults are RAG-R1's published PPO run where it
gives one (actor lr 1e-6, critic lr 1e-5, KL 0.001, clip 0.2, value clip 0.5, entropy 0.001,
γ = λ = 1); the policy's loop settings (max 4 turns, top-k 3) live in the policy's config."""

from __future__ import annotations

import dataclasses

from ragr1.agent.information import TOKENS_PER_QUERY, TOP_K
from ragr1.services.common import ports
from ragr1.services.common.config import setting
from ragr1.services.common.server import ServerConfig


@dataclasses.dataclass
class ModelSettings:
    model_dir: str = setting("", "starting checkpoint (Hugging Face dir); empty = SmolLM2-135M-Instruct")
    lora_rank: int = setting(0, "LoRA rank; 0 trains every weight")
    lora_alpha: int = setting(32, "LoRA alpha (scale = alpha / rank)")
    bf16: bool = setting(True, "bfloat16 autocast (about 1.2x training, 1.8x forward on AVX-512 BF16 CPUs)")
    max_grad_norm: float = setting(1.0, "gradient clipping by global norm")
    micro_batch_size: int = setting(4, "sequences per forward/backward (gradients accumulate over the batch)")
    seed: int = setting(0, "random seed")
    output_dir: str = setting("runs/trainer", "checkpoints (v000001, …), steps.jsonl and curves.png go here")
    keep_checkpoints: int = setting(3, "how many recent checkpoint versions to keep on disk")


@dataclasses.dataclass
class SFTConfig(ModelSettings):
    # setting(..., factory=True) builds a default_factory field, which is what RUF009 asks for.
    train_files: list[str] = setting(
        lambda: ["hotpotqa"], "training sets (shipped names or JSONL paths) with supporting paragraphs", factory=True
    )
    modes: list[str] = setting(
        lambda: ["single", "multi"], "trajectory variants: single, multi (and none: answer without search)",
        factory=True,
    )
    limit: int = setting(64, "questions per training set")
    # Both must equal the policy's --top-k and --tokens-per-query: SFT shows the blocks the loop shows.
    top_k: int = setting(TOP_K, "passages per query in the <information> block (the policy's --top-k)")
    tokens_per_query: int = setting(
        TOKENS_PER_QUERY, "tokens of documents per query in the <information> block (the policy's value)"
    )
    lr: float = setting(1e-5, "learning rate")
    epochs: int = setting(1, "passes over the trajectories")
    batch_size: int = setting(8, "sequences per optimiser step")


@dataclasses.dataclass
class PPOSettings(ModelSettings):
    """The update itself (what a Ray worker needs, too)."""

    actor_lr: float = setting(1e-6, "actor learning rate")
    critic_lr: float = setting(1e-5, "value head learning rate")
    kl_coef: float = setting(0.001, "KL-to-reference loss coefficient; 0 skips the reference pass")
    kl_kind: str = setting("k3", "KL estimator: k1 or k3 (low variance, >= 0)")
    clip: float = setting(0.2, "policy ratio clip")
    value_clip: float = setting(0.5, "value clip around the old values")
    entropy_coef: float = setting(0.001, "entropy bonus coefficient")
    value_coef: float = setting(1.0, "value loss weight in the shared-trunk loss")
    gamma: float = setting(1.0, "discount")
    lam: float = setting(1.0, "GAE lambda")
    advantage: str = setting("gae", "gae (critic) or grpo (group-relative, no critic)")
    whiten_advantages: bool = setting(True, "normalise GAE advantages over the batch")
    tis_cap: float = setting(2.0, "truncation of the behaviour importance weight (decoupled PPO)")
    ppo_epochs: int = setting(1, "optimiser passes over each batch")


@dataclasses.dataclass
class PPOConfig(PPOSettings, ServerConfig):
    port: int = setting(ports.TRAINER, "gRPC port of the Trainer.Status service; 0 picks a free one")
    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis holding the prompts and rollouts streams")
    group: str = setting("trainer", "consumer group on the rollouts stream")
    consumer: str = setting("trainer-0", "consumer name; a restart with the same name resumes its pending")
    prompts_file: str = setting("", "QA JSONL or Search-R1 parquet of prompts; empty = train/hotpotqa")
    prompt_limit: int = setting(0, "use only the first N prompts; 0 = all")
    mode: str = setting("multi", "search mode of the prompts: single or multi")
    samples_per_prompt: int = setting(1, "rollouts per prompt (use > 1 with advantage=grpo)")
    batch_size: int = setting(16, "rollouts per update")
    max_staleness: int = setting(1, "drop rollouts more than this many versions behind the trainer")
    max_updates: int = setting(10, "stop after this many updates (0 = run until stopped)")
    start_version: int = setting(0, "version the policy serves the starting weights as (1 after a pushed SFT)")
    poll_ms: int = setting(1000, "longest wait for rollouts per read")
    policy_replicas: list[str] = setting(
        list, "host:port of every policy replica to send UpdateWeights", factory=True
    )
    update_timeout_seconds: float = setting(120.0, "deadline of each UpdateWeights call")
    max_failed_pushes: int = setting(
        3, "stop with an error once a policy replica has refused this many weight versions in a row"
    )
    num_workers: int = setting(1, "data-parallel workers; > 1 runs each update under Ray Train")
