"""A second language: the Node.js client of ``examples/node-retriever`` (``@grpc/grpc-js`` and
``@grpc/proto-loader``, reading ``proto/`` alone) installed as its README says (``npm ci``) and run
against a real retriever: passages of the shipped corpus come back, and bad input is refused naming the
status and the reason."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ragr1.protogen import PROTO_DIR
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.retriever.corpus import PassageStore
from ragr1.shipped import ROOT

EXAMPLE = ROOT / "examples" / "node-retriever"
QUERIES = ["Which Canadian rock band released a song called Counterparts?", "Modern Drummer"]


@pytest.fixture(scope="module")
def node_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example copied out of the checkout (so that node_modules lands in a temporary folder) and
    installed from its lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed to test the Node.js client (examples/node-retriever): "
                    "scripts/install.sh installs them as root (Debian packages nodejs and npm)")
    folder = tmp_path_factory.mktemp("node-retriever")
    for name in ("package.json", "package-lock.json", "search.js"):
        shutil.copy(EXAMPLE / name, folder / name)
    out = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=folder, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return folder


def search(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["node", "search.js", "--proto", str(PROTO_DIR), *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_the_node_client_gets_passages_of_the_shipped_corpus(
    node_client: Path, cluster: dict, store: PassageStore
) -> None:
    out = search(node_client, "--json", "--top-k", "3", cluster["grpc"], *QUERIES)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    got = [[(p["id"], p["title"], p["text"]) for p in r["passages"]] for r in reply["results"]]
    assert [len(r) for r in got] == [3, 3] and not reply["partial"]
    corpus = {p.id: (p.id, p.title, p.text) for p in store}  # the slice of data/corpus the index holds
    assert all(corpus[p[0]] == p for result in got for p in result)
    with RetrieverClient(cluster["grpc"]) as client:  # the same answer as the Python client's
        expected = [[(p.id, p.title, p.text) for p in r.passages] for r in client.search(QUERIES, 3).results]
    assert got == expected
    # The human-readable form: each query, then its passages ranked, with titles.
    text = search(node_client, cluster["grpc"], QUERIES[0])
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == QUERIES[0]
    assert f"  1. {expected[0][0][1]} [{expected[0][0][0]}] score " in text.stdout


def test_the_node_client_reports_a_refusal_in_one_line(node_client: Path, cluster: dict) -> None:
    out = search(node_client, "--top-k", "101", cluster["grpc"], "q")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"ragr1.v1.Retriever/Search at {cluster['grpc']}: INVALID_ARGUMENT: "
        "top_k must be an integer in [1, max_top_k=100], got 101"
    )


def node(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """search.js as run outside the repository (the fixture's copy), without ``--proto`` unless given."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAGR1_")}
    return subprocess.run(["node", "search.js", *args], cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**environment, **(env or {})})


def test_the_node_client_outside_the_repository_asks_for_proto_in_one_line(node_client: Path) -> None:
    out = node(node_client, "127.0.0.1:1", "q")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("search.js: error: ") and line.endswith("the repository's proto/ folder with --proto DIR")


def test_the_node_client_names_an_unreachable_retriever_without_an_empty_note(node_client: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    out = node(node_client, "--proto", str(PROTO_DIR), "--timeout", "5", address, "q")
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"ragr1.v1.Retriever/Search at {address}: UNAVAILABLE: "), line
    assert "Resolution note" not in line and not line.endswith(":"), line


def test_the_node_client_reads_the_python_clients_token_variable(node_client: Path, tmp_path: Path) -> None:
    """RAGR1_CLIENT_TOKEN_FILE, as ``ragr1.services.common.client`` reads it: a missing file is named, a
    token read from one is sent (here without TLS, which it warns about)."""
    missing = tmp_path / "none"
    out = node(node_client, "--proto", str(PROTO_DIR), "127.0.0.1:1", "q",
               env={"RAGR1_CLIENT_TOKEN_FILE": str(missing)})
    assert (out.returncode, out.stderr.strip()) == (
        2, f"search.js: error: token file (--token-file, RAGR1_CLIENT_TOKEN_FILE) {missing}: no such file")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    out = node(node_client, "--proto", str(PROTO_DIR), "--timeout", "2", "127.0.0.1:1", "q",
               env={"RAGR1_CLIENT_TOKEN_FILE": str(token)})
    assert out.stderr.splitlines()[0] == "warning: sending a bearer token without TLS", out.stderr
