"""Fixtures every test folder may use: a real Redis server, free ports, the shipped policy model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ragr1.services.common.redis_server import RedisServer, free_port

# Property tests and fuzzing draw the same cases on every run by default, so that CI's verdict is the code's,
# not the draw's; HYPOTHESIS_PROFILE=explore draws new ones (to look for failures no run has drawn yet).
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Models load from the packages that ship them; nothing may reach a hub at test time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture()
def redis_client(redis_server: RedisServer):  # type: ignore[no-untyped-def]
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def policy_model_dir() -> Path:
    """SmolLM2-135M-Instruct, converted from the package that ships it (cached after the first time)."""
    from ragr1.model_paths import prepare_policy_model

    return prepare_policy_model()


@pytest.fixture(scope="session")
def tokenizer(policy_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(policy_model_dir))
