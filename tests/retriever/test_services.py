"""Shard and router processes on loopback: generated and HTTP clients, bad input, shards failing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ragr1.errors import ServiceCallError
from ragr1.protogen import PROTO_DIR
from ragr1.services.common.errors import Unavailable
from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.manifest import LoadedManifest, ManifestMismatch
from ragr1.services.retriever.router import Router, RouterSettings
from ragr1.services.retriever.server import check_shards
from ragr1.services.retriever.shard_client import AsyncShardClient
from ragr1.v1 import retriever_pb2
from tests.common import fuzz
from tests.common.waiting import wait_for
from tests.retriever.processes import start_router, start_shards

QUERIES = ["Which Canadian rock band released a song called Counterparts?", "Neil Peart", "Modern Drummer"]


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


GENERATED_CLIENT = textwrap.dedent("""
    import json, sys
    import grpc
    from ragr1.v1 import retriever_pb2, retriever_pb2_grpc
    assert "site-packages" not in retriever_pb2.__file__ and sys.argv[2] in retriever_pb2.__file__
    stub = retriever_pb2_grpc.RetrieverStub(grpc.insecure_channel(sys.argv[1]))
    reply = stub.Search(retriever_pb2.SearchRequest(queries=json.loads(sys.argv[3]), top_k=3), timeout=30)
    info = stub.Info(retriever_pb2.InfoRequest(), timeout=30)
    print(json.dumps({"ids": [[p.id for p in r.passages] for r in reply.results], "shards": info.num_shards,
                      "corpus": info.corpus_sha256, "manifest": info.manifest_sha256}))
""")


def test_a_client_generated_from_proto_alone_and_an_http_client_get_answers(
    cluster: dict, index_dirs: dict[int, Path], tmp_path: Path
) -> None:
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "ragr1" / "v1").glob("*.proto"))
    assert (
        protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos])
        == 0
    )
    for package in ("ragr1", "ragr1/v1"):  # regular packages, so that they win over the installed ragr1
        (tmp_path / package / "__init__.py").touch()
    script = tmp_path / "client.py"
    script.write_text(GENERATED_CLIENT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, str(script), cluster["grpc"], str(tmp_path), json.dumps(QUERIES)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    generated = json.loads(out.stdout)
    assert generated["shards"] == 2
    # What makes a number comparable: the corpus the index was built from, and the index itself.
    manifest = LoadedManifest(index_dirs[2])
    assert (generated["corpus"], generated["manifest"]) == (manifest.manifest.store_sha256, manifest.sha256)
    assert [len(ids) for ids in generated["ids"]] == [3, 3, 3]

    status, body = post(cluster["http"], json.dumps({"queries": QUERIES, "topk": 3, "return_scores": True}).encode())
    assert status == 200
    assert [[d["document"]["id"] for d in r] for r in body["result"]] == generated["ids"]
    top = body["result"][0][0]
    assert top["document"]["contents"].startswith('"') and isinstance(top["score"], float)
    status, body = post(cluster["http"], json.dumps({"queries": QUERIES[:1], "topk": 2}).encode())
    assert status == 200 and set(body["result"][0][0]) == {"id", "contents"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "request body is not valid JSON"),
        (b'{"queries": "one string"}', 422, "queries must be a list of strings"),
        (b'{"queries": [], "topk": 3}', 422, "queries is empty"),
        (b'{"queries": ["q"], "topk": 0}', 422, r"top_k must be an integer in [1, max_top_k=100], got 0"),
        (b'{"queries": ["q", ""], "topk": 3}', 422, "queries[1] is empty"),
    ],
)
def test_http_bad_input(cluster: dict, body: bytes, status: int, message: str) -> None:
    got_status, got = post(cluster["http"], body)
    assert got_status == status and message in got["detail"]


def test_grpc_bad_input_is_invalid_argument_naming_the_limit(cluster: dict) -> None:
    with RetrieverClient(cluster["grpc"]) as client:
        assert client.health()
        for queries, top_k, message in [
            ([], 3, "queries is empty"),
            (["q"], 101, "max_top_k=100"),
            (["x" * 2049], 3, "max_query_chars=2048"),
            (["q"] * 513, 3, "too many queries: 513 > max_queries=512"),
        ]:
            with pytest.raises(ServiceCallError) as err:
                client.search(queries, top_k)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert message in err.value.message
            assert f"ragr1.v1.Retriever/Search at {cluster['grpc']}: INVALID_ARGUMENT: " in str(err.value)


def test_router_exports_its_metrics(cluster: dict) -> None:
    post(cluster["http"], json.dumps({"queries": QUERIES, "topk": 3}).encode())
    with RetrieverClient(cluster["grpc"]) as client:
        client.search(QUERIES, 3)
    with urllib.request.urlopen(cluster["metrics"], timeout=10) as reply:
        text = reply.read().decode()
    for sample in [
        'ragr1_retriever_search_seconds_count{transport="grpc"}',
        'ragr1_retriever_search_seconds_count{transport="http"}',
        "ragr1_retriever_embed_seconds_count",
        'ragr1_retriever_shard_call_seconds_count{shard="1"}',
        'ragr1_retriever_batch_wait_seconds_count{stage="embed"}',
        'ragr1_retriever_batch_rows_count{stage="embed"}',
        "ragr1_retriever_queries_per_call_count",
        'ragr1_retriever_stage_seconds_count{stage="embed"}',
        'ragr1_retriever_stage_seconds_count{stage="fanout"}',
        'ragr1_retriever_stage_seconds_count{stage="merge"}',
        'ragr1_retriever_shard_ready{shard="1"} 1.0',
    ]:
        assert sample in text, sample


def test_router_refuses_shards_of_another_index(cluster: dict, index_dirs: dict[int, Path]) -> None:
    async def check() -> None:
        shards = [AsyncShardClient(t) for t in cluster["shards"]]
        try:
            await check_shards(shards, LoadedManifest(index_dirs[3]), 5)
        finally:
            for s in shards:
                await s.close()

    with pytest.raises(ManifestMismatch, match="serves an index with manifest sha256"):
        asyncio.run(check())


def test_shard_refuses_to_start_on_a_corrupted_index(index_dirs: dict[int, Path], tmp_path: Path) -> None:
    copy = tmp_path / "index"
    shutil.copytree(index_dirs[2], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["store_dir"] = str(LoadedManifest(index_dirs[2]).store_path().resolve())
    (copy / "manifest.json").write_text(json.dumps(manifest))
    shard_file = copy / manifest["shards"][0]["file"]
    shard_file.write_bytes(shard_file.read_bytes()[:-4] + b"\0\0\0\0")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragr1",
            "serve",
            "retriever-shard",
            "--index",
            str(copy),
            "--shard",
            "0",
            "--port",
            "0",
            "--metrics-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "shard 0:" in out.stderr and "the manifest says" in out.stderr


def test_a_paused_then_killed_shard_never_makes_calls_hang(
    index_dirs: dict[int, Path], tmp_path: Path, processes: list[ServiceProcess], encoder: Encoder
) -> None:
    shards = start_shards(index_dirs[2], 2, tmp_path, processes)
    grpc_target = start_router(
        index_dirs[2], shards, tmp_path, processes, "--on-shard-failure", "partial", "--shard-health-interval-s", "0.2"
    )["grpc"]
    victim = processes[1].process
    assert victim is not None
    deadline = 5.0  # generous: on a busy host embedding alone can take a second or more

    def call(_: int) -> tuple[float, bool, list[int]]:
        with RetrieverClient(grpc_target) as client:
            started = time.monotonic()
            reply = client.search(QUERIES, 3, timeout=deadline)
            return time.monotonic() - started, reply.partial, list(reply.missing_shards)

    with RetrieverClient(grpc_target) as client:
        assert not client.search(QUERIES, 3).partial
        assert client.shards_ready() == [True, True]
    shard_metrics = f"http://127.0.0.1:{processes[0].wait_ready(10, 'retriever-shard-0')['metrics']}/metrics"
    with urllib.request.urlopen(shard_metrics, timeout=10) as reply:
        text = reply.read().decode()
    assert "ragr1_retriever_shard_index_mmap 1.0" in text
    ready_s = float(re.search(r"^ragr1_retriever_shard_time_to_ready_seconds (\S+)$", text, re.M)[1])  # type: ignore[index]
    assert 0 < ready_s < 120
    with ThreadPoolExecutor(8) as pool:
        victim.send_signal(signal.SIGSTOP)  # late: connected, never answers
        late = list(pool.map(call, range(8)))
        victim.kill()  # down
        victim.wait()
        down = list(pool.map(call, range(8)))
    for elapsed, partial, missing in late + down:
        assert elapsed < deadline + 1.0
        assert partial and missing == [1]
    # The router's health tells which shard is gone.
    with RetrieverClient(grpc_target) as client:
        wait_for(lambda: client.shards_ready() == [True, False], "the router's health never showed shard 1 gone", 10,
                 0.1)

    async def unavailable_mode() -> None:
        clients = [AsyncShardClient(t) for t in shards]
        router = Router(encoder, clients, RouterSettings(on_shard_failure="unavailable"))
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match=r"1 of 2 shards did not answer \(shard 1: "):
                await router.search(QUERIES, 3, timeout=deadline)
            assert time.monotonic() - started < deadline + 1.0
        finally:
            await router.aclose()
            for c in clients:
                await c.close()

    asyncio.run(unavailable_mode())


# JSON bodies for POST /retrieve: Search-R1's shape with arbitrary values, and arbitrary JSON.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_RETRIEVE = st.fixed_dictionaries(
    {"queries": st.lists(st.text(max_size=30), max_size=4) | _JSON},
    optional={"topk": st.integers(-2, 200) | _JSON, "return_scores": _JSON},
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_requests_to_every_rpc_get_defined_answers(cluster: dict, data: st.DataObject) -> None:
    """Fuzzing the router's and a shard's RPCs with bytes and the HTTP endpoint with JSON: every call is
    answered in time with OK or a caller's-mistake code; the services stay up (checked after)."""
    services = retriever_pb2.DESCRIPTOR.services_by_name
    routes = [(cluster["grpc"], m) for m in fuzz.methods(services["Retriever"])]
    routes += [(cluster["shards"][0], m) for m in fuzz.methods(services["RetrieverShard"])]
    target, (path, request) = data.draw(st.sampled_from(routes))
    with grpc.insecure_channel(target) as channel:
        code = fuzz.call(channel, path, data.draw(fuzz.requests(request)), timeout=20)
    assert code in fuzz.DEFINED, (path, code)
    event(f"{path}: {code.name}")
    status, reply = post(cluster["http"], json.dumps(data.draw(_RETRIEVE | _JSON)).encode())
    event(f"POST /retrieve: {status}")
    assert status in (200, 400, 422) and ("result" in reply if status == 200 else "detail" in reply), reply


def test_services_are_healthy_after_the_fuzzing(cluster: dict) -> None:
    with RetrieverClient(cluster["grpc"]) as client:
        assert client.health()
        assert len(client.search(["Who wrote Hamlet?"], 3).results[0].passages) == 3
