"""Fixtures every test folder may use: a real Redis server, free ports, the shipped policy model."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from ragr1.services.common import redis_server as _redis_server
from ragr1.services.common.redis_server import RedisServer, free_port
from tests.common import background_mypy, scheduling
from tests.common.servers import retriever_server, reward_server  # noqa: F401  (fixtures, registered here)

if TYPE_CHECKING:
    from tests.common.engine import SharedEngine

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
    if _count > 1:
        # One CPU thread per worker, for everything it starts (torch and vLLM inherit the environment): OpenMP's
        # threads meet at the end of every operation, so a process of two threads on two cores beside another
        # busy process keeps waiting for whichever of its threads is descheduled; one thread waits for nobody.
        # vLLM binds its threads to cores ("auto"), which would put every engine's one thread on core 0.
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"

_mypy: subprocess.Popen[bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _mypy
    # Only the controller of a multi-worker run (it hands out tests and runs none) that includes the lint tests.
    paths = [Path(str(arg).split("::")[0]).resolve() for arg in config.args] or [Path(__file__).resolve().parent]
    if not _WORKER and getattr(config.option, "numprocesses", None) and background_mypy.covers(paths):
        _mypy = background_mypy.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _mypy is not None:
        background_mypy.stop(_mypy)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _WORKER:
        scheduling.order(items)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the groups of tests/common/scheduling.py."""
    if config.getvalue("dist") == "loadfile":
        return scheduling.GroupedFileScheduling(config, log)
    return None


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


@pytest.fixture(scope="session")
def shared_engine() -> Iterator[SharedEngine]:
    """The session's in-process vLLM engine; a module takes it with ``for_module()``."""
    from tests.common.engine import SharedEngine

    engines = SharedEngine()
    try:
        yield engines
    finally:
        engines.close()
