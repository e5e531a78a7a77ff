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


def checkpoint_files(directory: Path) -> dict[str, int]:
    """Every file of a checkpoint directory (names relative to it, sub-folders included) and its size in bytes:
    what a reader on other storage waits for before the checkpoint is complete."""
    directory = Path(directory)
    return {str(f.relative_to(directory)): f.stat().st_size for f in sorted(directory.rglob("*")) if f.is_file()}


def missing_files(directory: Path, files: dict[str, int]) -> str:
    """What of ``files`` (``checkpoint_files``) ``directory`` does not hold yet, named; "" when it holds them all
    at their sizes."""
    short, absent = [], []
    for name, size in files.items():
        try:
            got = (Path(directory) / name).stat().st_size
        except OSError:
            absent.append(name)
            continue
        if got != size:
            short.append(f"{name} ({got} of {size} bytes)")
    if not absent and not short:
        return ""
    parts = ([f"{len(absent)} of {len(files)} files absent (e.g. {absent[0]})"] if absent else []) + short[:3]
    return f"checkpoint {directory} is not complete: " + "; ".join(parts)
