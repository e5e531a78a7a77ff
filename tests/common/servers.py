"""Real reward and retriever servers, one per session, for the policy tests and the scale rig's (tests/bench/):
fixtures that tests/conftest.py registers for every folder, so that the two folders' modules, run on one worker
(tests/common/scheduling.py), start them once.

The retriever serves a flat index over the gold paragraphs of the first HotpotQA training
questions plus a slice of the shared corpus (a few hundred passages: seconds to embed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.shipped import corpus_path, read_jsonl, train_path

HOTPOT_QUESTIONS = 4
EXTRA_PASSAGES = 150


def hotpot_rows(n: int = HOTPOT_QUESTIONS) -> list[dict[str, Any]]:
    return list(read_jsonl(train_path("hotpotqa"), limit=n))


def _ragr1(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "ragr1", *args], check=True, capture_output=True)


@pytest.fixture(scope="session")
def reward_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    port = free_port()
    log = tmp_path_factory.mktemp("reward") / "reward.log"
    with ServiceProcess.ragr1(
        "reward", ["serve", "reward", "--port", str(port), "--metrics-port", "0"], f"127.0.0.1:{port}", log
    ) as service:
        yield service


@pytest.fixture(scope="session")
def retriever_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("retriever")
    wanted = {p["pid"] for row in hotpot_rows() for p in row["paragraphs"]}
    rows = list(read_jsonl(corpus_path()))
    chosen = [r for r in rows if r["id"] in wanted] + [r for r in rows if r["id"] not in wanted][
        :EXTRA_PASSAGES
    ]
    corpus = root / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": r["id"], "title": r["title"], "text": r["text"]}) + "\n" for r in chosen)
    )
    _ragr1("corpus", "ingest", "--input", str(corpus), "--out", str(root / "store"))
    _ragr1(
        "index",
        "build",
        "--store",
        str(root / "store"),
        "--out",
        str(root / "index"),
        "--index-type",
        "flat",
        "--embeddings-dir",
        str(root / "embeddings"),
    )
    shard_port, router_port = free_port(), free_port()
    with (
        ServiceProcess.ragr1(
            "retriever-shard",
            [
                "serve",
                "retriever-shard",
                "--index",
                str(root / "index"),
                "--port",
                str(shard_port),
                "--metrics-port",
                "0",
            ],
            f"127.0.0.1:{shard_port}",
            root / "shard.log",
        ),
        ServiceProcess.ragr1(
            "retriever",
            [
                "serve",
                "retriever",
                "--index",
                str(root / "index"),
                "--shards",
                f"127.0.0.1:{shard_port}",
                "--port",
                str(router_port),
                "--metrics-port",
                "0",
                "--http-port",
                "-1",
            ],
            f"127.0.0.1:{router_port}",
            root / "router.log",
        ) as router,
    ):
        yield router
