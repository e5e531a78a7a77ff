"""The GPU check's model FLOPs utilisation and PPO/SFT ratio, on the CPU: the FLOPs a step costs from the
architecture, the card's bf16 peak by name (blank for a card not in the table), and each PPO row beside
its SFT row."""

from __future__ import annotations

import pytest

from bench.gpu import check as gpu_check
from bench.gpu import mfu
from bench.gpu import sections as gpu_sections


def test_the_peak_is_found_by_the_name_torch_reports_and_unknown_cards_get_none() -> None:
    assert mfu.peak_bf16("NVIDIA H200") == 989e12
    assert mfu.peak_bf16("NVIDIA H100 80GB HBM3") == 989e12  # SXM
    assert mfu.peak_bf16("NVIDIA H100 PCIe") == 756e12
    assert mfu.peak_bf16("NVIDIA A100-SXM4-80GB") == 312e12
    assert mfu.peak_bf16("Tesla T4") is None
    assert mfu.peak_bf16(None) is None  # the CPU
    assert mfu.mfu(1000.0, 1e9, None) is None


def test_flops_per_token_count_the_passes_each_step_makes() -> None:
    n = 1.5e9
    # SFT with checkpointing: forward, backward, recomputed forward = 8N; without, 6N; LoRA's backward is half.
    assert mfu.sft_flops_per_token(n, lora=False, checkpointing=True) == 8 * n
    assert mfu.sft_flops_per_token(n, lora=False, checkpointing=False) == 6 * n
    assert mfu.sft_flops_per_token(n, lora=True, checkpointing=True) == 6 * n
    # PPO with a critic and a KL reference: 3 forwards in prepare, then actor and critic trained once = 22N,
    # the count; PPO/SFT at equal utilisation is then 8/22.
    ppo = mfu.ppo_flops_per_token(n, lora=False, checkpointing=True, critic=True, reference=True, epochs=1)
    assert ppo == 22 * n
    assert mfu.ppo_flops_per_token(n, lora=False, checkpointing=True, critic=False, reference=False, epochs=2) == (
        2 * n + 2 * 8 * n
    )
    # The H200 report's SFT row (28,227 tok/s at 8N per token, N = 1.5e9) by this count.
    assert mfu.mfu(28_227, 8 * n, mfu.peak_bf16("NVIDIA H200")) == pytest.approx(0.3425, abs=1e-3)


def test_a_ppo_row_is_reported_beside_its_sft_row_with_mfu_in_the_table() -> None:
    sft = {"section": "trainer", "case": "SFT step, full, m", "status": "ok", "rate": 1000.0, "unit": "tok/s",
           "seconds": 1.0, "mfu": 0.4}
    ppo = {"section": "trainer", "case": "PPO update, full, m", "status": "ok", "rate": 300.0, "unit": "tok/s",
           "seconds": 2.0, "mfu": None}
    paired = gpu_sections.beside_sft(ppo, sft)
    assert paired["vs"] == pytest.approx(0.3) and paired["vs_what"] == "SFT step"
    assert gpu_sections.beside_sft(ppo, None) == ppo
    assert gpu_sections.beside_sft(ppo, {**sft, "status": "FAILED"}) == ppo
    assert gpu_check.cells_of(paired)[4:6] == ["0.30x SFT step", ""]  # no peak known: MFU blank
    assert gpu_check.cells_of(sft)[5] == "40.0%"
    assert len(gpu_check.cells_of(sft)) == len(gpu_check.COLUMNS) - 3
