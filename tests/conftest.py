"""Fixtures every test folder may use: a real Redis server, free ports, the shipped policy model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ragr1.services.common import redis_server as _redis_server
from ragr1.services.common.redis_server import RedisServer, free_port

# Property tests and fuzzing draw the same cases on every run by default, so that CI's verdict is the code's,
# not the draw's; HYPOTHESIS_PROFILE=explore draws new ones (to look for failures no run has drawn yet).
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Models load from the packages that ship them; nothing may reach a hub at test time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# `make test` runs the suite on pytest-xdist workers (processes). free_port() only remembers the ports its own
# process handed out, so two workers could be handed one port and the later bind fails; each worker takes
# its own stripe of the range instead.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    _count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _all = _redis_server._PORTS
    _redis_server._PORTS = range(_all.start + int(_WORKER[2:]), _all.stop, _count)

# Modules that share a session fixture that is slow to start run on one worker (`--dist loadgroup`), which
# starts it once; every other module is its own group, so that its module fixtures start once too.
SHARED_FIXTURE_GROUPS = {
    # The reward and retriever services of tests/policy/conftest.py.
    "tests/policy/test_integration.py": "policy-services",
    "tests/policy/test_worker.py": "policy-services",
    "tests/policy/test_retrieval.py": "policy-services",
}
# Groups handed out first (longest first), so that the longest ones do not start last and leave one worker
# running alone at the end: see docs/results for the suite's profile these come from.
LONG_GROUPS = (
    "policy-services",
    "tests/trainer/test_engine_sync.py",
    "tests/trainer/test_ray_train.py",
    "tests/trainer/test_learning.py",
)


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    path = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent.parent).as_posix()
    return SHARED_FIXTURE_GROUPS.get(path, path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist reads the marks in its own hook of the same name.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    if _WORKER:
        # Every worker collects and must find the same order (a stable sort of a fixed ranking); the
        # scheduler hands groups out in this order under --no-loadscope-reorder.
        rank = {name: i for i, name in enumerate(LONG_GROUPS)}
        items.sort(key=lambda item: rank.get(_group(item), len(rank)))


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
