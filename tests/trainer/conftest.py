"""Trainer test fixtures: a tiny randomly initialised model with SmolLM2's tokenizer and architecture
family, so that queue and restart tests exercise the real training path in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.common.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
