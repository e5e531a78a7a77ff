"""The measurements of the GPU check (``bench/gpu/check.py`` runs this file as its child process).

Every section goes through the project's own code: the trainer's ``SFTTrainer.step`` and
``PPOUpdater.update`` (bf16 autocast, layer checkpointing, LoRA or full fine-tuning), FSDP2 through
``PPOUpdater.build(shard=True)`` in a one-process group, the policy's ``AgentLoop`` driven by the
``transformers`` engine of ``bench/rollout/policy_throughput.py`` (vLLM cannot be carried to a lent GPU), and the
retriever's Flat index (``services/retriever/index.py``) on faiss-cpu against the same search as a torch
matrix product on the device, or FAISS's own GPU index where a GPU build of faiss is installed.

Models have the real architectures (SmolLM2-135M, Qwen2.5-0.5B and -1.5B, from their published
config.json values written below) and random weights: nothing is downloaded. Their tokenizer is made here
too (``synthetic_tokenizer``): byte-level, with as many ids as the model's vocabulary, so that every id the
model samples decodes and stop strings are found as with a real tokenizer; prompts come out longer in tokens
(one per byte) than a trained tokenizer makes them. Training batches are random token ids, with the
information spans masked as RAG-R1's rollouts have them.

Protocol: each event is one JSON line appended to ``--events``: ``environment`` once, then per section
``start``, a ``row`` per measurement (ok, FAILED with a one-line reason, or SKIPPED), ``end``; ``modules``
(the top-level modules this process imported) last. A failure is caught per measurement, so one failure
never stops the others; a hang or a crash is the parent's to catch (it kills this process and starts another
one for the remaining sections).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import string
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import mfu  # noqa: E402  (after the path: this file runs as a script)
from bench.trainer.opcount import count_operators  # noqa: E402

GIB = 2**30
SECTIONS = ("trainer", "fsdp", "rollout", "retriever")
# A section starts no new measurement after this share of its budget: the last one started has the rest.
START_SHARE = 0.7
# The packages whose versions the environment lists (read from their metadata: nothing is imported).
PACKAGES = ("transformers", "peft", "accelerate", "tokenizers", "numpy", "faiss-cpu", "faiss-gpu-cu12", "grpcio",
            "protobuf", "redis")


@dataclasses.dataclass(frozen=True)
class Arch:
    """A decoder's shape, as its config.json gives it."""

    model_type: str  # "llama" (SmolLM2) or "qwen2"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    max_positions: int
    rms_eps: float


ARCHS = {
    "SmolLM2-135M": Arch("llama", 576, 1536, 30, 9, 3, 49152, 100000.0, 8192, 1e-5),
    "Qwen2.5-0.5B": Arch("qwen2", 896, 4864, 24, 14, 2, 151936, 1000000.0, 32768, 1e-6),
    "Qwen2.5-1.5B": Arch("qwen2", 1536, 8960, 28, 12, 2, 151936, 1000000.0, 32768, 1e-6),
    # --tiny: the same two families at toy sizes.
    "tiny-llama": Arch("llama", 64, 128, 2, 4, 2, 512, 10000.0, 4096, 1e-5),
    "tiny-qwen2": Arch("qwen2", 64, 128, 2, 4, 2, 640, 10000.0, 4096, 1e-6),
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    trainer_archs: tuple[str, ...]
    sequences: int  # per SFT step and per PPO update
    prompt_tokens: int
    response_tokens: int
    # SFT: sequences per forward/backward; PPO: rollouts per mini-batch (each one optimiser step).
    micro_batch: int
    repeats: int  # timed steps
    warm_up: bool  # one untimed step first (kernels chosen, optimiser state allocated)
    fsdp_arch: str
    rollout_archs: tuple[str, ...]
    rollout_tasks: int
    rollout_max_tokens: int
    vectors: int
    dim: int
    query_batches: tuple[int, ...]
    min_search_seconds: float  # timed calls of one search last at least this long (after a warm-up call)
    # torch's CPU threads; 0 leaves torch's default. Toy sizes gain nothing from threads, and on busy shared
    # cores (CI's) spinning threads make them many times slower.
    threads: int


# A shard of a 21M-passage BGE-large index split over 8 shards: 2,625,000 x 1024 float32 (10.8 GB).
GPU_SIZES = Sizes(
    # Largest first: should time run short, what goes unmeasured is the small model, measured on CPUs already.
    trainer_archs=("Qwen2.5-1.5B", "Qwen2.5-0.5B", "SmolLM2-135M"),
    sequences=8, prompt_tokens=512, response_tokens=1536, micro_batch=4, repeats=2, warm_up=True,
    fsdp_arch="Qwen2.5-0.5B",
    rollout_archs=("SmolLM2-135M", "Qwen2.5-0.5B", "Qwen2.5-1.5B"), rollout_tasks=64, rollout_max_tokens=128,
    vectors=2_625_000, dim=1024, query_batches=(1, 64, 512), min_search_seconds=0.5, threads=0,
)
TINY_SIZES = Sizes(
    trainer_archs=("tiny-llama", "tiny-qwen2"),
    sequences=4, prompt_tokens=16, response_tokens=48, micro_batch=2, repeats=1, warm_up=False,
    fsdp_arch="tiny-qwen2",
    rollout_archs=("tiny-llama", "tiny-qwen2"), rollout_tasks=4, rollout_max_tokens=8,
    vectors=20_000, dim=64, query_batches=(1, 16), min_search_seconds=0.05, threads=1,
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def synthetic_tokenizer(vocab_size: int) -> Any:
    """A byte-level tokenizer with exactly ``vocab_size`` ids and a ChatML template: the special tokens, the
    256 bytes, then words (" a", " b", …) that the model can sample and that decode to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in [*SPECIAL_TOKENS, *sorted(pre_tokenizers.ByteLevel.alphabet())]:
        vocab[token] = len(vocab)
    n = 0
    while len(vocab) < vocab_size:
        n += 1
        word, rest = "", n
        while rest:
            rest, digit = divmod(rest - 1, 26)
            word = string.ascii_lowercase[digit] + word
        vocab.setdefault("Ġ" + word, len(vocab))  # Ġ: the byte-level alphabet's space
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_model(name: str, directory: Path, device: Any) -> Path:
    """A checkpoint of architecture ``name`` with random weights (built on ``device``, saved in bf16 on a GPU)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    arch = ARCHS[name]
    config_class = LlamaConfig if arch.model_type == "llama" else Qwen2Config
    config = config_class(
        vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers, num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
        max_position_embeddings=arch.max_positions, rope_theta=arch.rope_theta, rms_norm_eps=arch.rms_eps,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(directory, safe_serialization=True)
    synthetic_tokenizer(arch.vocab).save_pretrained(directory)
    del model
    return directory


def torch_device(name: str) -> Any:
    import torch

    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device cuda, but torch {torch.__version__} sees no CUDA GPU; use --device cpu")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclasses.dataclass
class Context:
    device_name: str
    sizes: Sizes
    workdir: Path
    _models: dict[str, Path] = dataclasses.field(default_factory=dict)

    @property
    def device(self) -> Any:
        return torch_device(self.device_name)

    @property
    def cuda(self) -> bool:
        return self.device_name == "cuda"

    def model_dir(self, name: str) -> Path:
        """The random checkpoint of ``name``, written once per process."""
        if name not in self._models:
            self._models[name] = write_model(name, Path(tempfile.mkdtemp(prefix=name, dir=self.workdir)), self.device)
        return self._models[name]

    def gpu_name(self) -> str | None:
        """The card's name as torch reports it (None on the CPU): it keys the bf16 peak (``bench/gpu/mfu.py``)."""
        if not self.cuda:
            return None
        import torch

        return str(torch.cuda.get_device_name(self.device))

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def release(self) -> None:
        """Frees what the last measurement left (its models are garbage by now, some of them in cycles)."""
        gc.collect()
        # What is left is alive (the imported libraries, mostly): frozen, the next collections skip it. A full
        # collection over all of transformers' objects costs a second or more.
        gc.freeze()
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()

    def memory(self) -> dict[str, float | None]:
        """GiB allocated now and at most since ``reset_peak`` (None on the CPU)."""
        if not self.cuda:
            return {"state_gib": None, "peak_gib": None}
        import torch

        return {
            "state_gib": torch.cuda.memory_allocated() / GIB,
            "peak_gib": torch.cuda.max_memory_allocated() / GIB,
        }


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def row(section: str, case: str, **fields: Any) -> dict[str, Any]:
    return {"section": section, "case": case, "status": "ok", **fields}


def failed(section: str, case: str, exc: BaseException) -> dict[str, Any]:
    traceback.print_exc()
    return {"section": section, "case": case, "status": "FAILED", "reason": one_line(exc)}


def skipped(section: str, case: str, reason: str) -> dict[str, Any]:
    return {"section": section, "case": case, "status": "SKIPPED", "reason": reason}


def attempt(ctx: Context, section: str, case: str, soft_deadline: float, fn: Callable[[], dict[str, Any]]) -> (
    dict[str, Any]
):
    """``fn``'s row, or FAILED with its exception's first line; memory is released after either."""
    if time.time() > soft_deadline:
        return skipped(section, case, "the section's time budget was spent")
    print(f"[{section}] {case}", flush=True)
    try:
        result = row(section, case, **fn())
    except Exception as exc:  # recorded in the table; the next measurement goes on
        result = failed(section, case, exc)
    # Out of the handler: the exception and the frames it holds (an out-of-memory error's tensors) are gone.
    ctx.release()
    return result


# -- trainer -------------------------------------------------------------------------------------------


def token_sequences(sizes: Sizes, vocab: int, seed: int = 0) -> list[Any]:
    """Random sequences; each response alternates a generated stretch and three times as long an
    information block (masked), three times, as a multi-query rollout does."""
    import torch

    from ragr1.services.trainer.data import TokenSequence

    generator = torch.Generator().manual_seed(seed)
    total = sizes.prompt_tokens + sizes.response_tokens
    ids = torch.randint(len(SPECIAL_TOKENS), vocab, (sizes.sequences, total), generator=generator).tolist()
    period = max(4, sizes.response_tokens // 3)
    mask = [1 if i % period < period // 4 else 0 for i in range(sizes.response_tokens)]
    return [TokenSequence(row[: sizes.prompt_tokens], row[sizes.prompt_tokens :], list(mask)) for row in ids]


def ppo_samples(sizes: Sizes, vocab: int) -> list[Any]:
    from ragr1.services.trainer.updater import Sample

    return [Sample(f"s{i}", seq, float(i % 2)) for i, seq in enumerate(token_sequences(sizes, vocab))]


def measure(ctx: Context, step: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """Tokens/s and seconds a step over the timed steps, GiB held between steps and at most during them,
    and the first step's statistics ("first")."""
    sizes = ctx.sizes
    first = step() if sizes.warm_up else None
    ctx.sync()
    ctx.reset_peak()
    seconds = []
    tokens = 0.0
    for _ in range(sizes.repeats):
        start = time.perf_counter()
        stats = step()
        ctx.sync()
        seconds.append(time.perf_counter() - start)
        tokens, first = stats["tokens"], first or stats
    per_step = sum(seconds) / len(seconds)
    return {"rate": tokens / per_step, "unit": "tok/s", "seconds": per_step, **ctx.memory(), "first": first}


def operators(step: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """The operators one more step dispatches per token (``bench/trainer/opcount.py``), and the five most frequent."""
    stats: dict[str, dict[str, float]] = {}
    counts = count_operators(lambda: stats.setdefault("step", step()))
    tokens = stats["step"]["tokens"]
    top = {name: round(n / tokens, 2) for name, n in counts.by_name.most_common(5)}
    return {"ops_per_token": counts.total / tokens, "ops_top": top}


def sft_case(ctx: Context, arch: str, lora_rank: int, count: bool = False) -> dict[str, Any]:
    from ragr1.services.trainer.config import SFTConfig
    from ragr1.services.trainer.sft import SFTTrainer

    s = ctx.sizes
    config = SFTConfig(
        model=str(ctx.model_dir(arch)), lora_rank=lora_rank, device=ctx.device_name, bf16=True,
        gradient_checkpointing=True, batch_size=s.sequences, micro_batch_size=s.micro_batch,
    )
    trainer = SFTTrainer(config)
    sequences = token_sequences(s, ARCHS[arch].vocab)
    result = measure(ctx, lambda: trainer.step(sequences))
    result.pop("first")
    per_token = mfu.sft_flops_per_token(
        parameters(trainer.model.base()), lora=lora_rank > 0, checkpointing=config.gradient_checkpointing
    )
    counted = operators(lambda: trainer.step(sequences)) if count else {}
    return {**result, **utilisation(ctx, result["rate"], per_token), **counted}


def parameters(model: Any) -> float:
    """The architecture's parameters (LoRA adapters left out; tied embeddings counted once, as the head)."""
    return float(sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name))


def utilisation(ctx: Context, rate: float, flops_per_token: float) -> dict[str, Any]:
    return {"flops_per_token": flops_per_token, "mfu": mfu.mfu(rate, flops_per_token, mfu.peak_bf16(ctx.gpu_name()))}


def ppo_settings(ctx: Context, lora_rank: int) -> Any:
    from ragr1.services.trainer.config import PPOSettings

    # The trainer's defaults (a critic, a KL reference, bf16, checkpointing, 4,096-token micro-batches)
    # but no learning-rate warm-up.
    return PPOSettings(
        lora_rank=lora_rank, device=ctx.device_name, max_updates=0, mini_batch_size=ctx.sizes.micro_batch
    )


def ppo_case(ctx: Context, arch: str, lora_rank: int, count: bool = False) -> dict[str, Any]:
    from ragr1.services.trainer.updater import PPOUpdater

    settings = ppo_settings(ctx, lora_rank)
    updater = PPOUpdater.build(settings, ctx.model_dir(arch))
    samples = ppo_samples(ctx.sizes, ARCHS[arch].vocab)
    result = measure(ctx, lambda: updater.update(samples))
    result.pop("first")
    per_token = mfu.ppo_flops_per_token(
        parameters(updater.actor.base()), lora=lora_rank > 0, checkpointing=settings.gradient_checkpointing,
        critic=updater.critic is not None, reference=settings.kl_coef > 0, epochs=settings.ppo_epochs,
    )
    counted = operators(lambda: updater.update(samples)) if count else {}
    return {**result, **utilisation(ctx, result["rate"], per_token), **counted}


def beside_sft(ppo: dict[str, Any], sft: dict[str, Any] | None) -> dict[str, Any]:
    """A PPO row with its tokens/s as a share of the SFT step's on the same model and sequences, and its
    operators per token as a multiple of the SFT step's where both were counted."""
    if sft is None or sft.get("status") != "ok" or ppo.get("status") != "ok":
        return ppo
    row = {**ppo, "vs": ppo["rate"] / sft["rate"], "vs_what": "SFT step"}
    if "ops_per_token" in ppo and "ops_per_token" in sft:
        row["ops_vs_sft"] = ppo["ops_per_token"] / sft["ops_per_token"]
        row["note"] = (
            f"{row.get('note', '')}; {ppo['ops_per_token']:.1f} operators a token, "
            f"{row['ops_vs_sft']:.2f}x the SFT step's {sft['ops_per_token']:.1f}"
        )
    return row


def trainer_section(ctx: Context, soft_deadline: float) -> Iterator[dict[str, Any]]:
    s = ctx.sizes
    shape = f"{s.sequences} seq x {s.prompt_tokens + s.response_tokens} tok, bf16, checkpointing"
    sft: dict[tuple[str, int], dict[str, Any]] = {}
    # Full fine-tuning of the largest model first, its operators counted: the rows issue 54's goal is read from.
    for arch in s.trainer_archs:
        for lora_rank in (0, 16):
            count = arch == s.trainer_archs[0] and lora_rank == 0
            for stage, case_fn in (("SFT", sft_case), ("PPO", ppo_case)):
                kind = f"LoRA r{lora_rank}" if lora_rank else "full"
                case = f"{stage} step, {kind}, {arch}" if stage == "SFT" else f"{stage} update, {kind}, {arch}"

                def run(
                    fn: Callable[..., dict[str, Any]] = case_fn, a: str = arch, r: int = lora_rank, c: bool = count
                ) -> dict[str, Any]:
                    note = shape + ("; critic + KL reference" if fn is ppo_case else "")
                    return {**fn(ctx, a, r, c), "note": note}

                result = attempt(ctx, "trainer", case, soft_deadline, run)
                if stage == "SFT":
                    sft[arch, lora_rank] = result
                else:
                    result = beside_sft(result, sft.get((arch, lora_rank)))
                yield result


# -- FSDP ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def process_group(device: Any) -> Iterator[str]:
    """A one-process group: NCCL on a GPU, gloo on the CPU."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    extra = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, **extra)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def fsdp_section(ctx: Context, soft_deadline: float) -> Iterator[dict[str, Any]]:
    from ragr1.services.trainer.fsdp import process_group_reduce
    from ragr1.services.trainer.updater import PPOUpdater

    s = ctx.sizes
    arch = s.fsdp_arch
    settings = ppo_settings(ctx, 0)
    samples = ppo_samples(s, ARCHS[arch].vocab)
    plain: dict[str, Any] = {}

    def unsharded() -> dict[str, Any]:
        updater = PPOUpdater.build(settings, ctx.model_dir(arch))
        plain.update(measure(ctx, lambda: updater.update(samples)))
        return {**{k: v for k, v in plain.items() if k != "first"}, "note": "one process, no process group"}

    def sharded() -> dict[str, Any]:
        device = ctx.device
        with process_group(device) as backend:
            updater = PPOUpdater.build(settings, ctx.model_dir(arch), device, shard=True)
            if not updater.sharded:
                raise RuntimeError("PPOUpdater.build(shard=True) left the actor's weights unsharded")
            result = measure(ctx, lambda: updater.update(samples, 0, 1, process_group_reduce(device)))
        first = result.pop("first")
        result["note"] = f"fully_shard per decoder layer, {backend}, world size 1"
        if plain:
            # The same first update from the same weights and rollouts: how far the sharded one strays.
            gaps = [abs(first[k] - plain["first"][k]) for k in ("policy_loss", "value_loss")]
            result["note"] += (
                f"; the first update's policy/value losses differ from no sharding's by {gaps[0]:.1e}/{gaps[1]:.1e}"
            )
            result.update({"vs": result["rate"] / plain["rate"], "vs_what": "no sharding", "loss_gap": max(gaps)})
        return result

    yield attempt(ctx, "fsdp", f"PPO update, full, {arch}, no sharding", soft_deadline, unsharded)
    yield attempt(ctx, "fsdp", f"PPO update, full, {arch}, FSDP2", soft_deadline, sharded)


# -- rollout -------------------------------------------------------------------------------------------


def rollout_section(ctx: Context, soft_deadline: float) -> Iterator[dict[str, Any]]:
    from bench.rollout.policy_throughput import NoSearch, TransformersEngine, run_loop
    from ragr1.services.policy.agent import GenerationRequest, LoopConfig, Sampling, Task
    from ragr1.shipped import read_jsonl, train_path

    s = ctx.sizes
    tasks = [Task(r["id"], r["question"]) for r in read_jsonl(train_path("hotpotqa"), limit=s.rollout_tasks)]
    loop = LoopConfig(max_turns=1)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens_per_turn=s.rollout_max_tokens, seed=1234)

    def case(arch: str) -> dict[str, Any]:
        directory = ctx.model_dir(arch)
        start = time.perf_counter()
        engine = TransformersEngine(directory, device=str(ctx.device), dtype="bfloat16")
        tokenizer = engine.tokenizer
        warm_up = [GenerationRequest(tokenizer.encode("Hello"), 4, None)]
        asyncio.run(engine.generate(warm_up, sampling, ()))
        load = time.perf_counter() - start
        ctx.reset_peak()
        run = asyncio.run(run_loop(arch, engine, NoSearch(), tokenizer, tasks, loop, sampling, load))
        prompt = sum(len(t.prompt_ids) for t in run.trajectories) / len(run.trajectories)
        return {
            "rate": run.generated / run.seconds, "unit": "tok/s", "seconds": run.seconds, **ctx.memory(),
            "generated": run.generated,
            "note": (
                f"{len(tasks)} HotpotQA questions, {loop.max_turns} turn + the answer turn, "
                f"{s.rollout_max_tokens} new tokens a turn; {run.generated} generated, prompts {prompt:.0f} "
                f"tokens (byte-level); bf16; load {load:.1f} s"
            ),
        }

    for arch in s.rollout_archs:
        yield attempt(ctx, "rollout", f"agent loop, transformers generate, {arch}", soft_deadline,
                      functools.partial(case, arch))


# -- retriever -----------------------------------------------------------------------------------------


def timed(search: Callable[[], Any], sync: Callable[[], None], min_seconds: float = 0.5, max_calls: int = 20) -> (
    float
):
    """Seconds a call: after a warm-up call, as many calls as fit ``min_seconds`` (the warm-up alone when it
    took longer than that: a slow search is not repeated)."""
    start = time.perf_counter()
    search()
    sync()
    first = time.perf_counter() - start
    if first >= min_seconds:
        return first
    calls, start = 0, time.perf_counter()
    while calls < max_calls and (calls == 0 or time.perf_counter() - start < min_seconds):
        search()
        sync()
        calls += 1
    return (time.perf_counter() - start) / calls


def faiss_gpu_reason(faiss: Any) -> str:
    """Why FAISS's own GPU index is not measured here, or "" when it can be."""
    from ragr1.services.retriever import index as faiss_index

    if faiss is None:
        return "faiss is not importable here (carry faiss-cpu: scripts/gpu-wheels.sh)"
    if faiss_index.gpu_count(faiss) == 0:
        return (
            f"faiss {faiss.__version__} here is a CPU build; a GPU build of FAISS cannot be carried to a lent "
            "GPU (its wheels and the CUDA 12 libraries they need pass the 64 MiB limit: docs/gpu-check.md)"
        )
    return ""


def retriever_section(ctx: Context, soft_deadline: float) -> Iterator[dict[str, Any]]:
    import numpy as np
    import torch

    from ragr1.protocol.information import TOP_K
    from ragr1.services.retriever import index as faiss_index

    s = ctx.sizes
    device = ctx.device
    shape = f"{s.vectors:,} x {s.dim}"
    try:
        import faiss
    except ImportError:
        faiss = None
    # Unit vectors (BGE's are normalised: inner product = cosine); each query is a stored vector plus noise,
    # so that its true nearest neighbour is known.
    generator = torch.Generator(device=device).manual_seed(0)
    vectors = torch.randn(s.vectors, s.dim, device=device, generator=generator)
    vectors.div_(vectors.norm(dim=1, keepdim=True))
    most = max(s.query_batches)
    truth = torch.randint(0, s.vectors, (most,), device=device, generator=generator)
    queries = vectors[truth] + torch.randn(most, s.dim, device=device, generator=generator) * (0.5 / s.dim**0.5)
    queries.div_(queries.norm(dim=1, keepdim=True))
    host_vectors = vectors.cpu().numpy()
    host_queries = queries.cpu().numpy()
    host_truth = truth.cpu().numpy()

    def torch_search(db: torch.Tensor) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        def search(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            found = []
            on_device = torch.from_numpy(q).to(device, db.dtype)
            for start in range(0, len(on_device), 256):  # [256 x vectors] scores at a time
                found.append((on_device[start : start + 256] @ db.T).topk(TOP_K, dim=1))
            scores = torch.cat([f.values for f in found]).float().cpu().numpy()
            return scores, torch.cat([f.indices for f in found]).cpu().numpy()

        return search

    engines: list[tuple[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]]] = []
    notes: dict[str, str] = {}
    reason = faiss_gpu_reason(faiss)
    if faiss is not None:
        if s.threads:
            faiss.omp_set_num_threads(s.threads)
        spec = faiss_index.IndexSpec("flat")
        start = time.perf_counter()
        built = faiss_index.build(faiss, host_vectors, spec, False)
        cpu_index = faiss_index.prepare_for_search(faiss, built, spec, False)
        built_in = time.perf_counter() - start
        notes["faiss-cpu"] = f"IndexFlatIP, {faiss.omp_get_max_threads()} threads; built in {built_in:.1f} s"
        engines.append(("faiss-cpu", lambda q: cpu_index.search(q, TOP_K)))
        if not reason and ctx.cuda:
            gpu_index = faiss_index.prepare_for_search(faiss, cpu_index, spec, True)
            engines.append(("faiss GPU", lambda q: gpu_index.search(q, TOP_K)))
    del host_vectors
    engines.append((f"torch fp32 matmul+topk, {device.type}", torch_search(vectors)))
    half = vectors.half() if ctx.cuda else vectors.bfloat16()  # CPUs have no fast fp16 matmul
    engines.append((f"torch {str(half.dtype).split('.')[-1]} matmul+topk, {device.type}", torch_search(half)))
    if reason:
        yield skipped("retriever", f"Flat IP {shape}: FAISS GPU index", reason)

    baseline: dict[int, tuple[float, np.ndarray]] = {}

    def case(name: str, search: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], batch: int) -> (
        dict[str, Any]
    ):
        q = np.ascontiguousarray(host_queries[:batch])
        ctx.reset_peak()
        seconds = timed(lambda: search(q), ctx.sync, s.min_search_seconds)
        _scores, ids = search(q)
        top1 = float((ids[:, 0] == host_truth[:batch]).mean())
        if top1 < 1.0:
            raise RuntimeError(f"top-1 is the planted neighbour for only {top1:.1%} of the queries")
        fields: dict[str, Any] = {"rate": batch / seconds, "unit": "queries/s", "seconds": seconds, **ctx.memory()}
        note = f"top-{TOP_K}, the planted neighbour first for every query"
        if name == "faiss-cpu":
            baseline[batch] = (seconds, ids)
            note += "; " + notes["faiss-cpu"]
        elif batch in baseline:
            base_seconds, base_ids = baseline[batch]
            same = np.mean([len(set(a) & set(b)) / TOP_K for a, b in zip(ids, base_ids, strict=True)])
            fields.update({"vs": base_seconds / seconds, "vs_what": "faiss-cpu", "overlap": float(same)})
            note += f"; {same:.1%} of faiss-cpu's top-{TOP_K} ids"
        return {**fields, "note": note}

    for batch in s.query_batches:
        for name, search in engines:
            yield attempt(ctx, "retriever", f"Flat IP {shape}, {batch} queries: {name}", soft_deadline,
                          functools.partial(case, name, search, batch))


SECTION_FUNCTIONS: dict[str, Callable[[Context, float], Iterator[dict[str, Any]]]] = {
    "trainer": trainer_section,
    "fsdp": fsdp_section,
    "rollout": rollout_section,
    "retriever": retriever_section,
}


# -- the child process ---------------------------------------------------------------------------------


def environment(device_name: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
    }
    for package in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            env[package] = importlib.metadata.version(package)
    if device_name == "cuda":
        try:
            device = torch_device("cuda")
            props = torch.cuda.get_device_properties(device)
            env.update(
                gpu=props.name,
                gpu_memory_gib=round(props.total_memory / GIB, 1),
                capability=f"{props.major}.{props.minor}",
                multiprocessors=props.multi_processor_count,
                nccl=".".join(str(v) for v in torch.cuda.nccl.version()),
            )
            torch.ones(1, device=device).sum().item()  # the device answers
        except Exception as exc:  # recorded; every section then fails with its own reason
            env["error"] = one_line(exc)
    return env


class Events:
    def __init__(self, path: Path) -> None:
        self.path = path

    def emit(self, event: str, **fields: Any) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"event": event, "time": time.time(), **fields}, default=str) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="the GPU check's measurements (run by bench/gpu/check.py)")
    parser.add_argument("--events", required=True, type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--sections", required=True, help="comma-separated, in order")
    parser.add_argument("--budgets", required=True, help="section=seconds,…")
    parser.add_argument("--until", type=float, required=True, help="time.time() by which everything must end")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    events = Events(args.events)
    budgets = {k: float(v) for k, v in (item.split("=") for item in args.budgets.split(","))}
    events.emit("environment", environment=environment(args.device))
    workdir = Path(tempfile.mkdtemp(prefix="ragr1-gpu-check-"))
    ctx = Context(args.device, TINY_SIZES if args.tiny else GPU_SIZES, workdir)
    if ctx.sizes.threads:
        import torch

        torch.set_num_threads(ctx.sizes.threads)
    try:
        for name in args.sections.split(","):
            start = time.time()
            soft_deadline = start + START_SHARE * max(0.0, min(budgets[name], args.until - start))
            events.emit("start", section=name)
            try:
                for result in SECTION_FUNCTIONS[name](ctx, soft_deadline):
                    events.emit("row", section=name, row=result)
            except Exception as exc:  # the section's set-up failed: one row says why
                events.emit("row", section=name, row=failed(name, "(the section)", exc))
            ctx.release()
            events.emit("end", section=name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        events.emit("modules", modules=sorted({m.split(".")[0] for m in sys.modules}))


if __name__ == "__main__":
    main()
