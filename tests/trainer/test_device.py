"""Where the trainer's networks run: CUDA when torch sees a GPU, the CPU otherwise, chosen at start; a CUDA
request on a machine without one stops ``train sft`` and ``train ppo`` before a model or Redis is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragr1.cli import main
from ragr1.services.trainer.config import PPOSettings, SFTConfig
from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.model import PolicyModel, collate, native_bf16, training_device


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where torch sees no GPU (this one, or a pod without its nvidia.com/gpu)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_picks_the_gpu_when_torch_sees_one(monkeypatch: pytest.MonkeyPatch, no_gpu: None) -> None:
    assert training_device("auto") == torch.device("cpu")
    assert training_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # Ray Train makes a worker's own GPU current
    assert training_device("auto") == torch.device("cuda", 3)
    assert training_device("cuda") == torch.device("cuda", 3)
    assert training_device("cpu") == torch.device("cpu")


def test_bf16_autocast_is_on_by_default_only_where_the_hardware_computes_bfloat16(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    cpu = torch.device("cpu")
    cpuinfo = tmp_path / "cpuinfo"
    for flags, native in (("fpu avx2 avx512f avx512bw", False), ("fpu avx2 avx512f avx512_bf16", True),
                          ("fpu avx2 amx_tile amx_bf16", True)):
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        assert native_bf16(cpu, cpuinfo) is native, flags
    assert native_bf16(cpu, tmp_path / "absent") is False  # not Linux: float32, never the emulated path
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert native_bf16(torch.device("cuda", 0)) is True
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)  # a V100 or a T4
    assert native_bf16(torch.device("cuda", 0)) is False
    # Unset follows this machine's CPU; a setting wins either way.
    assert PPOSettings().bf16 is None and SFTConfig().bf16 is None
    assert PolicyModel(tiny_model_dir).bf16 is native_bf16(cpu)
    assert PolicyModel(tiny_model_dir, bf16=True).bf16 is True
    assert PolicyModel(tiny_model_dir, bf16=False).bf16 is False


def test_cuda_without_a_gpu_is_an_error_that_says_what_to_do(no_gpu: None) -> None:
    with pytest.raises(ValueError, match=r"device=cuda, but torch .* sees no CUDA GPU .*use --device cpu"):
        training_device("cuda")
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, got 'gpu'"):
        PPOSettings(device="gpu")
    with pytest.raises(ValueError, match=r"device must be one of"):
        SFTConfig(device="tpu")


def test_train_sft_refuses_cuda_before_loading_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_gpu: None
) -> None:
    code = main(["train", "sft", "--device", "cuda", "--output-dir", str(tmp_path / "sft")])
    assert code == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "sft").exists()


def test_train_ppo_refuses_cuda_before_connecting_to_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_gpu: None
) -> None:
    # Nothing listens on port 1: had the trainer got as far as Redis, the error would be a connection error.
    code = main(["train", "ppo", "--device", "cuda", "--redis-url", "redis://127.0.0.1:1/0",
                 "--output-dir", str(tmp_path / "ppo"), "--port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "sees no CUDA GPU" in err and "Connection" not in err


def test_a_model_on_the_cpu_returns_cpu_outputs_with_gradients(tiny_model_dir: Path) -> None:
    model = PolicyModel(tiny_model_dir, device=training_device("cpu"))
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}
    batch = collate([TokenSequence([1, 2, 3], [4, 5], [1, 1])], model.pad_id)
    assert batch.to(torch.device("cpu")) is batch  # no copy where the batch already is
    out = model(batch)
    assert out.logprobs.device == torch.device("cpu") and out.logprobs.requires_grad
    out.logprobs.sum().backward()
    assert all(p.grad is not None for p in model.actor_parameters())
