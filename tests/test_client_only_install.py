"""``pip install ragr1`` with no extra installs the clients alone; its ``ragr1`` command must then say, in
one line, which extra to install, for ``--help`` and for any command, instead of a traceback.

The install is real where it matters: this repository is built and installed by pip (``--no-deps``: its
own files and its real ``ragr1`` entry point) into a fresh virtual environment. The base dependencies
(grpcio, grpcio-health-checking, protobuf and grpcio's typing-extensions) are not downloaded again: the
new environment sees exactly those, linked from this one's site-packages, and nothing else (the test
checks that yaml, the first thing the command misses, cannot be imported there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(sysconfig.get_paths()["purelib"])
# What ``dependencies`` in pyproject.toml brings, as importable names (typing_extensions: grpcio's own).
BASE = ["grpc", "grpc_health", "google/protobuf", "typing_extensions.py"]


@pytest.fixture(scope="module")
def client_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-only")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    deps = root / "deps"
    for name in BASE:
        (deps / name).parent.mkdir(parents=True, exist_ok=True)
        (deps / name).symlink_to(SITE / name)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "base-deps.pth").write_text(f"{deps}\n")
    # A copy of the sources, so that setuptools' build/ and egg-info stay out of the working tree.
    source = root / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".cache", "runs", "tests", "docs", "data", "deploy", "bench", "node_modules", "site",
        "__pycache__", "*.egg-info", "build"))
    # Built here (setuptools is in this environment, not in the new one), installed there, as pip would.
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-w", root / "wheel", source],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (root / "wheel").glob("ragr1-*.whl")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel],
                   check=True, capture_output=True, text=True, timeout=300)
    return env_dir


def run(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("RAGR1_", "PYTHON"))}
    return subprocess.run([env_dir / "bin" / "ragr1", *args], capture_output=True, text=True, timeout=60,
                          env=environment, cwd=env_dir)


def test_the_clients_import_and_the_server_parts_do_not(client_only: Path) -> None:
    python = client_only / "bin" / "python"
    probe = ("import importlib.util, ragr1.services.retriever.client, ragr1.errors;"
             "print(importlib.util.find_spec('yaml'), ragr1.__file__)")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=client_only, check=True).stdout
    assert out.startswith("None ") and str(client_only) in out, out


@pytest.mark.parametrize("args", [["--help"], ["serve", "retriever", "--port", "nope"], ["--version"]])
def test_the_command_names_the_extra_in_one_line(client_only: Path, args: list[str]) -> None:
    result = run(client_only, *args)
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "ragr1: error: this command needs the 'server' extra, which is not installed (no module 'yaml'): "
        "pip install 'ragr1[server]'"
    ], result.stderr
