"""Model FLOPs utilisation for the GPU check's trainer rows: the matrix FLOPs a step's tokens cost, from the
architecture's parameter count, against the card's dense bf16 peak.

Per token and pass over N parameters: a forward costs 2N; a backward 4N (gradients of the activations and
of the weights), or 2N with LoRA (the frozen weights get no gradient; the adapters' share is neglected); layer
checkpointing recomputes the forward, 2N more. The SFT step is one trained pass. The PPO update adds the
no-gradient forwards ``prepare`` makes (the proximal log-probs, the reference's, the critic's values), then
every epoch trains the actor and the critic. Attention's own FLOPs and the likelihood check's forward over the
reinforced rows are left out: this is the count the issue (44) reasons with, a lower bound.
"""

from __future__ import annotations

from collections.abc import Sequence

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' data sheets, by the name torch
# reports (torch.cuda.get_device_name); the first entry found in the name wins, so variants come first.
PEAK_BF16: Sequence[tuple[str, float]] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
)


def peak_bf16(device_name: str | None) -> float | None:
    """The card's bf16 peak, or None for a card not in the table (or the CPU): its MFU is left blank."""
    if not device_name:
        return None
    return next((peak for key, peak in PEAK_BF16 if key.lower() in device_name.lower()), None)


def trained_pass(params: float, *, lora: bool, checkpointing: bool) -> float:
    """FLOPs per token of one forward, backward (and recomputed forward) over ``params`` parameters."""
    return 2 * params + (2 if lora else 4) * params + (2 * params if checkpointing else 0)


def sft_flops_per_token(params: float, *, lora: bool, checkpointing: bool) -> float:
    return trained_pass(params, lora=lora, checkpointing=checkpointing)


def ppo_flops_per_token(
    params: float, *, lora: bool, checkpointing: bool, critic: bool, reference: bool, epochs: int
) -> float:
    """``prepare``'s forwards, then ``epochs`` of actor (and critic) training."""
    forwards = 1 + int(reference) + int(critic)
    trained = 1 + int(critic)
    return 2 * params * forwards + epochs * trained * trained_pass(params, lora=lora, checkpointing=checkpointing)


def mfu(tokens_per_second: float, flops_per_token: float, peak: float | None) -> float | None:
    """The share of ``peak`` the step's matrix FLOPs used (None without a peak)."""
    if peak is None or peak <= 0:
        return None
    return tokens_per_second * flops_per_token / peak
