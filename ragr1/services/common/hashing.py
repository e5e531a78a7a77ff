"""Content hashes of files and checkpoints, read in blocks so that a file of many GiB never sits in memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_sha256(directory: Path) -> str:
    """One SHA-256 over a Hugging Face checkpoint's weights: each ``*.safetensors`` file's name and bytes, in
    name order. The weights are what a result depends on; config and tokenizer files are left out (a
    re-saved tokenizer or a config field rewritten by another library version leaves the hash alone)."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} holds no *.safetensors files")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
    return digest.hexdigest()
