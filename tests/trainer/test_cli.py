"""``ragr1 train sft`` takes its settings from a file, the environment and flags, as every command does."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.cli import main
from ragr1.services.trainer.config import PPOConfig, SFTConfig


def test_sft_settings_from_a_file_the_environment_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[SFTConfig] = []

    class Trainer:
        def __init__(self, config: SFTConfig) -> None:
            seen.append(config)

        def train(self) -> Path:
            return tmp_path / "checkpoint"

    monkeypatch.setattr("ragr1.services.trainer.sft.SFTTrainer", Trainer)
    (tmp_path / "sft.yaml").write_text("train_files: [musique, mine.jsonl]\nepochs: 2\nlr: 0.1\n")
    monkeypatch.setenv("RAGR1_LR", "0.002")
    assert main(["train", "sft", "--config", str(tmp_path / "sft.yaml"), "--modes", "multi", "--epochs", "3"]) == 0
    (config,) = seen
    assert (config.train_files, config.modes) == (["musique", "mine.jsonl"], ["multi"])
    assert (config.lr, config.epochs) == (0.002, 3)
    assert f"SFT checkpoint: {tmp_path / 'checkpoint'}" in capsys.readouterr().out


def test_ppo_learning_rates_default_to_the_parameterisation() -> None:
    """LoRA adapters start at zero and move the model through a low-rank product: RAG-R1's full fine-tuning
    rates barely move them, so the defaults follow --lora-rank unless a rate is given."""
    lora = PPOConfig()
    assert lora.lora_rank > 0
    assert (lora.actor_learning_rate, lora.critic_learning_rate) == (1e-4, 1e-4)
    full = PPOConfig(lora_rank=0)
    assert (full.actor_learning_rate, full.critic_learning_rate) == (1e-6, 1e-5)  # RAG-R1's
    given = PPOConfig(actor_lr=3e-5, critic_lr=2e-5)
    assert (given.actor_learning_rate, given.critic_learning_rate) == (3e-5, 2e-5)
    with pytest.raises(ValueError, match="actor_lr must be positive"):
        PPOConfig(actor_lr=0.0)


def test_ppo_help_shows_the_learning_rates_of_both_parameterisations(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # The options' help, after the usage line that names every flag too.
    at = text.rindex("--actor-lr ACTOR_LR")
    critic_at = text.index("--critic-lr CRITIC_LR", at)
    actor, critic = text[at:critic_at], text[critic_at : text.index("--actor-warmup-ratio", critic_at)]
    assert "1e-06 when every weight trains (--lora-rank 0" in actor and "1e-04 with LoRA" in actor
    assert "1e-05 when every weight trains (--lora-rank 0" in critic and "1e-04 with LoRA" in critic
