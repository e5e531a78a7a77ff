"""Trainer test fixtures: a tiny randomly initialised model with SmolLM2's tokenizer and architecture
family, so that queue and restart tests exercise the real training path in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragr1.model_paths import prepare_policy_model


def make_tiny_model(target: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = prepare_policy_model()
    config = AutoConfig.from_pretrained(source)
    config.update(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
        }
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
