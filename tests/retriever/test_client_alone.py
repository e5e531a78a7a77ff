"""The clients install alone: a fresh virtual environment gets ``pip install <this tree>`` with no extra,
and its Python calls a real retriever (started from the project's own environment) through the installed
client, sync and async, without torch, vLLM, FAISS, ONNX Runtime or Ray being there at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.retriever.corpus import PassageStore
from ragr1.shipped import ROOT

QUERIES = ["Which Canadian rock band released a song called Counterparts?", "Neil Peart"]
HEAVY = ("torch", "vllm", "faiss", "onnxruntime", "ray")
# What a server needs and a client must not pull in either.
SERVER_ONLY = ("numpy", "yaml", "prometheus_client", "redis", "grpc_reflection", "transformers")

CLIENT = textwrap.dedent("""
    import asyncio, importlib.util, json, sys

    import grpc

    import ragr1
    from ragr1.errors import ServiceCallError
    from ragr1.services.policy.client import AsyncPolicyClient, PolicyClient
    from ragr1.services.retriever.client import AsyncRetrieverClient, RetrieverClient
    from ragr1.services.reward.client import AsyncRewardClient, RewardClient
    from ragr1.services.trainer.client import AsyncTrainerClient, TrainerClient

    target, queries = sys.argv[1], json.loads(sys.argv[2])
    with RetrieverClient(target, timeout=30) as client:
        healthy = client.health()
        reply = client.search(queries, top_k=3)
        shards = client.info().num_shards
        try:
            client.search([], top_k=3)
            refused = None
        except ServiceCallError as err:
            refused = [err.code.name, err.service, err.method, str(err)]

    async def aio():
        async with AsyncRetrieverClient(target, timeout=30) as client:
            return await client.search(queries, top_k=3)

    again = asyncio.run(aio())
    passages = lambda r: [[[p.id, p.title, p.text] for p in result.passages] for result in r.results]
    print(json.dumps({
        "ragr1": ragr1.__file__,
        "healthy": healthy,
        "shards": shards,
        "passages": passages(reply),
        "async_passages": passages(again),
        "refused": refused,
        "loaded": sorted(m for m in sys.modules),
        "installed": {m: importlib.util.find_spec(m) is not None for m in sys.argv[3].split(",")},
    }))
""")


def _installed_bytes(site_packages: Path) -> dict[str, int]:
    """Bytes on disk of each installed distribution (the files its RECORD lists)."""
    sizes = {}
    for record in site_packages.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0]
        total = 0
        for line in record.read_text().splitlines():
            path = site_packages / line.split(",")[0]
            if path.is_file():
                total += path.stat().st_size
        sizes[name] = total
    return sizes


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A new virtual environment with ``pip install <tree>`` (no extra) in it, made once per session."""
    root = tmp_path_factory.mktemp("client-venv")
    # The tree as pip reads it (pyproject.toml, README.md and the package), copied: building in place
    # would leave build/ and *.egg-info in the checkout.
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "ragr1", src / "ragr1", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = root / "venv"
    started = time.monotonic()
    # Without pip (ensurepip alone takes half a minute here): this environment's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-cache-dir",
         "--disable-pip-version-check", "-q", str(src)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    seconds = time.monotonic() - started
    (site_packages,) = venv.glob("lib/python*/site-packages")
    sizes = _installed_bytes(site_packages)
    print(f"\nclient install: {seconds:.0f} s, {sum(sizes.values()) / 2**20:.1f} MiB: "
          + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])))
    return {"python": python, "env": env, "sizes": sizes, "site_packages": site_packages, "cwd": root}


def test_the_client_installed_alone_calls_a_real_retriever_without_the_heavy_parts(
    client_venv: dict, cluster: dict, store: PassageStore
) -> None:
    script = client_venv["cwd"] / "client.py"
    script.write_text(CLIENT)
    out = subprocess.run(
        [str(client_venv["python"]), str(script), cluster["grpc"], json.dumps(QUERIES), ",".join(HEAVY + SERVER_ONLY)],
        cwd=client_venv["cwd"], env=client_venv["env"], capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # The installed copy answered, not this checkout.
    assert got["ragr1"].startswith(str(client_venv["site_packages"]))
    assert got["healthy"] and got["shards"] == 2
    # Passages of the shipped corpus, the same the project's own environment gets from the same router.
    with RetrieverClient(cluster["grpc"]) as client:
        reply = client.search(QUERIES, top_k=3)
    expected = [[[p.id, p.title, p.text] for p in result.passages] for result in reply.results]
    assert got["passages"] == expected == got["async_passages"]
    assert all(len(result) == 3 for result in got["passages"])
    corpus = {p.id: [p.id, p.title, p.text] for p in store}  # the slice of data/corpus the index holds
    assert all(corpus[p[0]] == p for result in got["passages"] for p in result)
    # Bad input: the one error type, naming the call and the service's reason.
    code, service, method, text = got["refused"]
    assert (code, service, method) == ("INVALID_ARGUMENT", "ragr1.v1.Retriever", "Search")
    assert "queries is empty" in text
    # Neither loaded nor even installed.
    loaded = {m.split(".")[0] for m in got["loaded"]}
    assert not loaded & set(HEAVY + SERVER_ONLY), loaded & set(HEAVY + SERVER_ONLY)
    assert not any(got["installed"].values()), got["installed"]
    assert set(client_venv["sizes"]) == {"ragr1", "grpcio", "grpcio_health_checking", "protobuf", "typing_extensions"}
    assert sum(client_venv["sizes"].values()) < 64 * 2**20
