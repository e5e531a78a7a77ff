"""``ragr1 index plan``: the sizes it prints follow FAISS's layouts (bad settings: test_config.py)."""

from __future__ import annotations

import pytest

from ragr1.cli import main
from ragr1.services.retriever import plan
from ragr1.services.retriever.index import IndexSpec


def test_shard_memory_follows_the_index_layouts() -> None:
    n, d = 21_000_000, 1024
    flat = plan.shard_memory(n, d, IndexSpec("flat"))
    assert flat.cpu_fp32 == n * d * 4 and flat.cpu_fp16 == n * d * 2  # 86 GB: the papers' Flat index
    assert flat.gpu_fp32 == flat.cpu_fp32 + plan.GPU_SCRATCH_BYTES
    ivfpq = plan.shard_memory(n, d, IndexSpec("ivfpq", nlist=65536, pq_m=64))
    assert n * 72 < ivfpq.cpu_fp32 < n * 72 + 300 * 2**20  # 64 code bytes + an 8-byte id each, + centroids
    hnsw = plan.shard_memory(n // 4, d, IndexSpec("hnsw", hnsw_m=32))
    assert hnsw.gpu_fp32 is None and hnsw.cpu_fp32 > (n // 4) * (d * 4 + 64 * 4)
    assert plan.scaled_rate(284.0, "all-MiniLM-L6-v2", "BAAI/bge-large-en-v1.5") == pytest.approx(10.0, rel=0.01)


def test_plan_prints_the_table_for_wikipedia(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["index", "plan", "--encoder", "intfloat/e5-base-v2", "--shard-counts", "1,8", "--encode-rate", "1000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "21,015,324 passages, intfloat/e5-base-v2 (768-d)" in out
    assert "| flat | 8 | 2,626,916 | 7.5 GiB | 3.8 GiB | 9.0 GiB | 5.3 GiB |" in out
    assert "| hnsw | 1 |" in out and "5.8 h" in out  # 21M passages at 1,000/s
