"""The fast encoder backends: agreement with float32 torch, the export beside the index and the checks
that keep a router from searching with another encoder than the one the passages were embedded with."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ragr1.services.retriever.encoder import (
    DEFAULT_BACKEND,
    DEFAULT_ENCODER,
    Encoder,
    EncoderSettings,
    onnx_providers,
    preset,
)
from ragr1.services.retriever.manifest import LoadedManifest, ManifestMismatch


def test_the_default_backend_is_close_to_float32_torch(encoder: Encoder, questions: list[str]) -> None:
    assert encoder.settings.backend == DEFAULT_BACKEND == "onnx-int8"
    torch_encoder = Encoder(preset(DEFAULT_ENCODER, "torch"), device="cpu")
    sample = questions[:40]
    cosine = np.sum(encoder.encode_queries(sample) * torch_encoder.encode_queries(sample), axis=1)
    # Per-channel int8 weights: MiniLM's query embeddings move by a cosine of ~0.994 on average.
    assert cosine.mean() > 0.985 and cosine.min() > 0.97, (cosine.mean(), cosine.min())
    norms = np.linalg.norm(encoder.encode_queries(sample[:3]), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    # One query alone or in a batch. float32: the same vector (padding must not leak into mean pooling).
    onnx = Encoder(preset(DEFAULT_ENCODER, "onnx"), device="cpu")
    assert float(onnx.encode_queries(sample[:1])[0] @ onnx.encode_queries(sample[:5])[0]) > 0.9999


def test_an_int8_vector_does_not_depend_on_its_batch(encoder: Encoder, questions: list[str]) -> None:
    """int8 activations are quantised with one scale a call: batched, a query's vector moved with its
    neighbours (by enough to reorder the passages a search returned from run to run). Each query runs
    alone, so its vector is the one it gets by itself: the same computation, to float rounding."""
    sample = questions[:12]
    alone = np.stack([encoder.encode_queries([q])[0] for q in sample])
    for batch in (sample, sample[::-1], [*sample[:5], "a much longer question " * 20, *sample[5:]]):
        rows = encoder.encode_queries(batch)
        got = {q: rows[i] for i, q in enumerate(batch)}
        np.testing.assert_allclose(np.stack([got[q] for q in sample]), alone, atol=1e-6)


def test_settings_validate_and_torch_keeps_its_old_cache_key() -> None:
    import hashlib

    with pytest.raises(ValueError, match="encoder backend must be one of"):
        EncoderSettings("m", pooling="mean", backend="tensorrt")
    torch_settings = preset(DEFAULT_ENCODER, "torch")
    # The key of the settings as they were before backends existed: cached embeddings stay valid.
    old = {k: v for k, v in dataclasses.asdict(torch_settings).items() if k != "backend"}
    assert torch_settings.key() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert len({preset(DEFAULT_ENCODER, b).key() for b in ("torch", "onnx", "onnx-int8")}) == 3
    # A local copy of a preset's model keeps the preset's pooling and instruction.
    local = preset("/models/bge-large-en-v1.5", "torch")
    assert local.name == "/models/bge-large-en-v1.5" and local.pooling == "cls" and local.query_prefix
    assert preset("/models/my-bert").pooling == "mean" and preset("/models/my-bert").query_prefix == ""


def test_onnx_providers_follow_the_device() -> None:
    cpu_only = ["CPUExecutionProvider"]
    assert onnx_providers("cpu", ["CUDAExecutionProvider", *cpu_only]) == cpu_only
    assert onnx_providers("cuda", ["CUDAExecutionProvider", *cpu_only]) == ["CUDAExecutionProvider", *cpu_only]
    assert onnx_providers("cuda:1", cpu_only) == cpu_only  # no onnxruntime-gpu: the CPU, with a warning


def test_the_index_carries_its_encoder_and_a_router_refuses_another(
    index_dirs: dict[int, Path], tmp_path: Path
) -> None:
    loaded = LoadedManifest(index_dirs[1])
    m = loaded.manifest
    assert m.encoder.backend == DEFAULT_BACKEND and m.encoder_export is not None
    directory = loaded.encoder_dir()
    assert directory == index_dirs[1] / "encoder" and (directory / "model.onnx").exists()
    assert all(s.bytes == (index_dirs[1] / s.file).stat().st_size for s in m.shards)
    with pytest.raises(ManifestMismatch, match=r"configured for encoder backend 'torch'.*built with 'onnx-int8'"):
        loaded.encoder_dir("torch")

    copy = tmp_path / "index"
    shutil.copytree(index_dirs[1], copy)
    data = json.loads((copy / "manifest.json").read_text())
    data["store_dir"] = str(loaded.store_path().resolve())
    (copy / "manifest.json").write_text(json.dumps(data))
    with open(copy / "encoder" / "model.onnx", "r+b") as handle:  # copytree copied it: not the cache's file
        handle.seek(-16, 2)
        handle.write(b"\0" * 16)
    with pytest.raises(ManifestMismatch, match="not the encoder this index was built with"):
        LoadedManifest(copy).encoder_dir()
    shutil.rmtree(copy / "encoder")
    with pytest.raises(ManifestMismatch, match="is missing"):
        LoadedManifest(copy).encoder_dir()


def test_a_manifest_from_before_backends_loads_as_torch(index_dirs: dict[int, Path], tmp_path: Path) -> None:
    data = json.loads((index_dirs[1] / "manifest.json").read_text())
    del data["encoder"]["backend"], data["encoder_export"]
    for shard in data["shards"]:
        del shard["bytes"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    loaded = LoadedManifest(tmp_path)
    assert loaded.manifest.encoder.backend == "torch" and loaded.encoder_dir() is None
    assert loaded.manifest.shards[0].bytes == 0  # unknown: the size check is skipped, not failed


def test_length_sorted_chunks_give_the_vectors_of_one_padded_batch(questions: list[str]) -> None:
    # float32: chunking only changes the padding, which masked attention and mean pooling ignore.
    chunked = Encoder(preset(DEFAULT_ENCODER, "onnx"), device="cpu", chunk_rows=4)
    whole = Encoder(preset(DEFAULT_ENCODER, "onnx"), device="cpu", chunk_rows=0)
    sample = questions[:23]  # not a multiple of the chunk: the last chunk is short
    np.testing.assert_allclose(chunked.encode_queries(sample), whole.encode_queries(sample), atol=1e-5)
    # Passages go through the same path, in several batches of batch_size.
    chunked.batch_size = whole.batch_size = 8
    np.testing.assert_allclose(chunked.encode_passages(sample), whole.encode_passages(sample), atol=1e-5)
