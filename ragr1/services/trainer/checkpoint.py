"""Versioned checkpoints, written atomically.

``<root>/v000007/`` holds ``policy/``, the Hugging Face checkpoint the policy loads (config, safetensors,
tokenizer: the only part a replica reads, so it never reads optimiser state), ``trainer_state.pt``
(trainable weights, optimiser) and ``meta.json`` (version, step, the digest of ``policy/``'s weights that the
replicas check what they load against, and the id of every rollout trained on so far, which is how a
restarted trainer knows what not to train again).
Each version is written to a temporary directory in the same folder and renamed into place, so a
reader (or a restarted trainer) only ever sees complete versions. torch is imported only to write or read
trainer state: every ``ragr1`` command imports this module (the demo's settings), and should not pay for it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ragr1.services.common.hashing import checkpoint_sha256

META = "meta.json"
STATE = "trainer_state.pt"
POLICY = "policy"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
# meta.json's key for the digest of policy/'s weights.
POLICY_SHA256 = "policy_sha256"


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:06d}"


def policy_dir(version_path: Path) -> Path:
    """The part of a version the policy loads (announced to the replicas, or ``--model``)."""
    return Path(version_path) / POLICY


def size_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())


class Checkpointer:
    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)

    def versions(self) -> list[int]:
        if not self.root.exists():
            return []
        found = [_VERSION_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir()]
        return sorted(int(m.group(1)) for m in found if m and (self.root / m.group(0) / META).exists())

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        versions = self.versions()
        if not versions:
            return None
        path = version_dir(self.root, versions[-1])
        return path, json.loads((path / META).read_text())

    def save(
        self,
        version: int,
        meta: dict[str, Any],
        write_policy: Callable[[Path], None],
        trainer_state: dict[str, Any] | None,
        in_use: Collection[int] = (),
    ) -> Path:
        """Writes version ``version``; ``write_policy(dir)`` saves the model files into ``policy_dir``. Older
        versions beyond the newest ``self.keep`` are deleted, except those in ``in_use`` (versions policy replicas
        still serve or load)."""
        self.root.mkdir(parents=True, exist_ok=True)
        target = version_dir(self.root, version)
        if target.exists():
            raise FileExistsError(f"checkpoint {target} already exists; versions only move forward")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=self.root))
        try:
            policy_dir(tmp).mkdir()
            write_policy(policy_dir(tmp))
            # Hashed once here, while the files just written are in the page cache: every replica checks
            # what it reads against it, and a restarted trainer announces it without reading them again.
            digest = checkpoint_sha256(policy_dir(tmp))
            if trainer_state is not None:
                import torch

                torch.save(trainer_state, tmp / STATE)
            (tmp / META).write_text(json.dumps({**meta, "version": version, POLICY_SHA256: digest}))
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(in_use)
        return target

    def policy_sha256(self, path: Path) -> str:
        """The digest of the version's policy weights: from its meta.json, or computed for a checkpoint
        written before the digest was recorded there."""
        meta = json.loads((Path(path) / META).read_text())
        return str(meta.get(POLICY_SHA256) or checkpoint_sha256(policy_dir(path)))

    def load_state(self, path: Path) -> dict[str, Any] | None:
        import torch

        file = Path(path) / STATE
        # On the CPU: the optimisers move their state to their parameters' device when they load it.
        return torch.load(file, weights_only=False, map_location="cpu") if file.exists() else None

    def _prune(self, in_use: Collection[int] = ()) -> None:
        for version in [v for v in self.versions()[: -self.keep] if v not in in_use]:
            shutil.rmtree(version_dir(self.root, version), ignore_errors=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
