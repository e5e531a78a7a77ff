"""The index manifest: what an index was built from and how, checked by every shard before it serves.

A shard that loads a file whose checksum, size or dimension differs from the manifest, or a passage
store other than the one the index was built over, refuses to start and says which fact differs:
serving mismatched rows would return wrong passages without any error. Likewise a router whose
encoder export (``encoder/`` beside the index) is not the one the manifest names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragr1.services.common.hashing import file_sha256
from ragr1.services.retriever.corpus import PassageStore
from ragr1.services.retriever.encoder import EncoderSettings, export_sha256, settings_from_dict
from ragr1.services.retriever.index import IndexSpec

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1


class ManifestMismatch(ValueError):
    """The files on disk are not the ones the manifest describes."""


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    file: str  # relative to the manifest's directory
    start: int  # first passage row (inclusive)
    end: int  # last passage row (exclusive)
    sha256: str
    # File size: checked at every start, cheaply, even when the checksum is checked later or never.
    # 0 in manifests written before it was recorded.
    bytes: int = 0


@dataclasses.dataclass(frozen=True)
class EncoderExport:
    """The exported query encoder (ONNX backends) kept beside the index."""

    dir: str  # relative to the manifest's directory
    sha256: str  # of its model file


@dataclasses.dataclass(frozen=True)
class Manifest:
    encoder: EncoderSettings
    dim: int
    index: IndexSpec
    num_passages: int
    store_dir: str  # absolute, or relative to the manifest's directory
    store_sha256: str
    shards: tuple[ShardEntry, ...]
    version: int = MANIFEST_VERSION
    # None for the torch backend (the model is loaded by name).
    encoder_export: EncoderExport | None = None

    @classmethod
    def over_store(
        cls,
        out_dir: Path,
        *,
        encoder: EncoderSettings,
        dim: int,
        index: IndexSpec,
        store: PassageStore,
        shards: Sequence[ShardEntry],
        encoder_export: EncoderExport | None,
    ) -> Manifest:
        """The manifest of shards written into ``out_dir`` over ``store`` (built or imported alike): the
        store is named relative to the index, so the two move together."""
        return cls(
            encoder=encoder,
            dim=dim,
            index=index,
            num_passages=len(store),
            store_dir=os.path.relpath(store.directory.resolve(), Path(out_dir).resolve()),
            store_sha256=store.sha256,
            shards=tuple(shards),
            encoder_export=encoder_export,
        )

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path


def shard_file(shard: int, num_shards: int, index_type: str) -> str:
    return f"shard-{shard:03d}-of-{num_shards:03d}.{index_type}.faiss"


def shard_entry(out_dir: Path, name: str, start: int, end: int) -> ShardEntry:
    """The entry of a shard file just written into ``out_dir``, its checksum and size read from disk."""
    path = Path(out_dir) / name
    return ShardEntry(name, start, end, file_sha256(path), path.stat().st_size)


def shard_ranges(num_passages: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal row ranges, in row order (so ties merge as one index would order them)."""
    if num_shards <= 0:
        raise ValueError(f"shard count must be positive, got {num_shards}")
    if num_shards > num_passages:
        raise ValueError(f"{num_shards} shards for {num_passages} passages: some shard would be empty")
    bounds = [num_passages * i // num_shards for i in range(num_shards + 1)]
    return list(itertools.pairwise(bounds))


class LoadedManifest:
    """A manifest read from disk, with its checksum and the directory its paths are relative to."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: build the index with `ragr1 index build`")
        raw = path.read_bytes()
        self.path = path
        self.directory = path.parent
        self.sha256 = hashlib.sha256(raw).hexdigest()
        data: dict[str, Any] = json.loads(raw)
        if data.get("version") != MANIFEST_VERSION:
            raise ManifestMismatch(f"{path}: manifest version {data.get('version')}, expected {MANIFEST_VERSION}")
        self.manifest = Manifest(
            encoder=settings_from_dict(data["encoder"]),
            dim=int(data["dim"]),
            index=IndexSpec(**data["index"]),
            num_passages=int(data["num_passages"]),
            store_dir=str(data["store_dir"]),
            store_sha256=str(data["store_sha256"]),
            shards=tuple(ShardEntry(**s) for s in data["shards"]),
            encoder_export=EncoderExport(**data["encoder_export"]) if data.get("encoder_export") else None,
        )

    def store_path(self) -> Path:
        return self.directory / self.manifest.store_dir

    def shard_path(self, shard: int) -> Path:
        return self.directory / self.manifest.shards[shard].file

    def entry(self, shard: int) -> ShardEntry:
        if not 0 <= shard < self.manifest.num_shards:
            raise ManifestMismatch(
                f"shard {shard} does not exist: the manifest lists {self.manifest.num_shards} shard(s)"
            )
        return self.manifest.shards[shard]

    def check_store(self, store: PassageStore) -> None:
        m = self.manifest
        if len(store) != m.num_passages or store.sha256 != m.store_sha256:
            raise ManifestMismatch(
                f"passage store {store.directory} ({len(store)} passages, sha256 {store.sha256[:12]}) "
                f"is not the one the index was built from ({m.num_passages} passages, "
                f"sha256 {m.store_sha256[:12]})"
            )

    def check_shard_file(self, shard: int, *, verify_checksum: bool = True) -> None:
        """Size always (cheap); the SHA-256 too when ``verify_checksum`` (reads the whole file)."""
        entry = self.entry(shard)
        path = self.shard_path(shard)
        if not path.exists():
            raise ManifestMismatch(f"shard {shard}: index file {path} is missing")
        size = path.stat().st_size
        if entry.bytes and size != entry.bytes:
            raise ManifestMismatch(
                f"shard {shard}: {path} has {size} bytes, the manifest says {entry.bytes} "
                "(truncated, rebuilt or corrupted file?)"
            )
        if verify_checksum:
            self.check_shard_checksum(shard)

    def check_shard_checksum(self, shard: int) -> None:
        entry = self.entry(shard)
        path = self.shard_path(shard)
        actual = file_sha256(path)
        if actual != entry.sha256:
            raise ManifestMismatch(
                f"shard {shard}: {path} has sha256 {actual[:12]}, the manifest says "
                f"{entry.sha256[:12]} (rebuilt or corrupted file?)"
            )

    def encoder_dir(self, backend: str = "") -> Path | None:
        """The checked directory of the index's encoder export (None for torch), for a router.

        ``backend``: the router's configured backend; empty takes the index's. A router whose
        encoder differs from the one the passages were embedded with would search with vectors
        from another space, so any difference is refused.
        """
        m = self.manifest
        if backend and backend != m.encoder.backend:
            raise ManifestMismatch(
                f"the router is configured for encoder backend {backend!r}, the index at {self.directory} "
                f"was built with {m.encoder.backend!r}: leave encoder_backend empty or rebuild the index"
            )
        if m.encoder.backend == "torch":
            return None
        if m.encoder_export is None:
            raise ManifestMismatch(f"{self.path}: backend {m.encoder.backend!r} but no encoder export listed")
        directory = self.directory / m.encoder_export.dir
        if not directory.is_dir():
            raise ManifestMismatch(f"encoder export {directory} is missing (copy it with the index)")
        actual = export_sha256(directory)
        if actual != m.encoder_export.sha256:
            raise ManifestMismatch(
                f"encoder export {directory} has sha256 {actual[:12]}, the manifest says "
                f"{m.encoder_export.sha256[:12]}: not the encoder this index was built with"
            )
        return directory

    def check_shard_index(self, shard: int, ntotal: int, dim: int) -> None:
        entry = self.entry(shard)
        if ntotal != entry.end - entry.start:
            raise ManifestMismatch(
                f"shard {shard}: index holds {ntotal} vectors, the manifest says "
                f"{entry.end - entry.start} (rows {entry.start}..{entry.end})"
            )
        if dim != self.manifest.dim:
            raise ManifestMismatch(f"shard {shard}: index dimension {dim}, the manifest says {self.manifest.dim}")
