"""FAISS index files read and written by byte ranges, so that an index far larger than memory can be split.

Flat indexes (``IxFI`` inner product, ``IxF2`` L2) are a fixed header followed by the vectors as
one float32 block; an HNSW-flat index (``IHNf``) is a header, its graph, and then a flat index
holding the vectors, so in both the vectors are the file's last ``ntotal * d * 4`` bytes. Reading
those by ranges with ``pread`` (not a memory map: mapped pages count as the process's resident memory
until the kernel evicts them) keeps an import's memory at the size of one chunk. The layout is
checked, not assumed: the length field before the block must match, and the first and last rows
must equal what FAISS itself reconstructs from the file. IVF files (``IwFl``, ``IwPQ``) are split by
their inverted lists instead (``ivf_file``), compressed as they are.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ragr1.services.retriever.ivf_file import IVF_FOURCC, check_same_quantizer

FLAT_FOURCC = {b"IxFI": "ip", b"IxF2": "l2"}
HNSW_FOURCC = b"IHNf"
METRICS = {0: "ip", 1: "l2"}  # faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2
# fourcc, d (int32), ntotal (int64), two unused int64, is_trained (bool), metric_type (int32).
_HEADER = struct.Struct("<4siqqqBi")


class UnsupportedIndex(ValueError):
    """A FAISS file this importer cannot split (another index type, or a layout it does not know)."""


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One FAISS file: its kind (``flat``, ``hnsw``, ``ivfflat`` or ``ivfpq``), shape, metric, where its
    vectors start (flat and HNSW)."""

    path: Path
    kind: str
    dim: int
    ntotal: int
    metric: str
    data_offset: int
    hnsw_m: int = 0
    ef_construction: int = 0
    ef_search: int = 0
    nlist: int = 0
    nprobe: int = 0

    def rows(self, start: int, end: int) -> np.ndarray:
        """Rows ``start..end`` of this file, read from disk (no memory map)."""
        if not 0 <= start <= end <= self.ntotal:
            raise IndexError(f"rows {start}..{end} outside {self.path} (0..{self.ntotal})")
        count = (end - start) * self.dim
        with open(self.path, "rb") as handle:
            out = np.fromfile(handle, dtype="<f4", count=count, offset=self.data_offset + start * self.dim * 4)
        if out.size != count:
            raise UnsupportedIndex(f"{self.path}: short read at rows {start}..{end} (truncated file?)")
        return out.reshape(end - start, self.dim)


def _read_vector_len(handle: BinaryIO, elem_size: int) -> int:
    """Reads a FAISS ``std::vector`` length and skips its elements; returns the length."""
    (size,) = struct.unpack("<Q", handle.read(8))
    handle.seek(size * elem_size, os.SEEK_CUR)
    return int(size)


def open_source(path: Path) -> SourceFile:
    """Parses the header of a flat or HNSW-flat FAISS file and checks where its vectors are."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        raw = handle.read(_HEADER.size)
        if len(raw) < _HEADER.size:
            raise UnsupportedIndex(f"{path}: {size} bytes, too short for a FAISS index")
        fourcc, dim, ntotal, _, _, _, metric_type = _HEADER.unpack(raw)
        if fourcc not in FLAT_FOURCC and fourcc != HNSW_FOURCC and fourcc not in IVF_FOURCC:
            raise UnsupportedIndex(
                f"{path}: FAISS index type {fourcc!r} cannot be imported; flat (IxFI, IxF2), HNSW-flat (IHNf), "
                "IVF-flat (IwFl) and IVF-PQ (IwPQ) can (others: import their flat original, or rebuild with "
                "`ragr1 index build`)"
            )
        if metric_type not in METRICS:
            raise UnsupportedIndex(f"{path}: metric type {metric_type}; only inner product and L2 are served")
        metric = METRICS[metric_type]
        if fourcc in IVF_FOURCC:
            nlist, nprobe = struct.unpack("<QQ", handle.read(16))
            return SourceFile(path, IVF_FOURCC[fourcc], dim, ntotal, metric, 0, nlist=nlist, nprobe=nprobe)
        data_offset = size - ntotal * dim * 4
        hnsw: dict[str, int] = {}
        if fourcc == HNSW_FOURCC:
            _read_vector_len(handle, 8)  # assign_probas (double)
            (levels_len,) = struct.unpack("<Q", handle.read(8))
            cum = np.frombuffer(handle.read(4 * levels_len), dtype="<i4")
            for elem in (4, 8, 4):  # levels, offsets, neighbors
                _read_vector_len(handle, elem)
            _, _, ef_construction, ef_search = struct.unpack("<4i", handle.read(16))
            hnsw = {"hnsw_m": int(cum[1]) // 2 if len(cum) > 1 else 0, "ef_construction": ef_construction,
                    "ef_search": ef_search}
        if data_offset < 8:
            raise UnsupportedIndex(f"{path}: {size} bytes cannot hold {ntotal} x {dim} float32 vectors")
        handle.seek(data_offset - 8)
        (floats,) = struct.unpack("<Q", handle.read(8))
    if floats != ntotal * dim:
        raise UnsupportedIndex(
            f"{path}: the vector block's length field says {floats} floats, the header {ntotal} x {dim} "
            "(a layout this importer does not know)"
        )
    source = SourceFile(path, "hnsw" if fourcc == HNSW_FOURCC else "flat", dim, ntotal, metric, data_offset, **hnsw)
    _check_against_faiss(source)
    return source


def _check_against_faiss(source: SourceFile) -> None:
    """The first and last rows as read here must be the ones FAISS reconstructs (flat files only:
    opening an HNSW file reads its whole graph, which is what this module avoids)."""
    if source.kind != "flat" or source.ntotal == 0:
        return
    import faiss

    index = faiss.read_index(str(source.path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    for row in (0, source.ntotal - 1):
        if not np.array_equal(index.reconstruct(row), source.rows(row, row + 1)[0]):
            raise UnsupportedIndex(f"{source.path}: row {row} read by range differs from FAISS's (unknown layout)")


class SourceParts:
    """An ordered list of FAISS files read as one index: rows continue from one file to the next."""

    def __init__(self, paths: Sequence[Path]) -> None:
        if not paths:
            raise ValueError("no index file given")
        self.parts = [open_source(Path(p)) for p in paths]
        first = self.parts[0]
        for part in self.parts[1:]:
            for fact in ("kind", "dim", "metric"):
                if getattr(part, fact) != getattr(first, fact):
                    raise UnsupportedIndex(
                        f"{part.path} has {fact} {getattr(part, fact)}, {first.path} has {getattr(first, fact)}: "
                        "the parts of one index must agree"
                    )
            if part.kind.startswith("ivf"):
                check_same_quantizer(first.path, part.path)
        self.bounds = np.cumsum([0, *(p.ntotal for p in self.parts)])

    @property
    def ntotal(self) -> int:
        return int(self.bounds[-1])

    @property
    def first(self) -> SourceFile:
        return self.parts[0]

    def ivf_parts(self, start: int, end: int) -> list[tuple[Path, int]]:
        """The files holding rows ``start..end``, each with its first row's global number."""
        return [(p.path, int(lo)) for p, lo, hi in zip(self.parts, self.bounds[:-1], self.bounds[1:], strict=True)
                if lo < end and hi > start]

    @property
    def nbytes(self) -> int:
        return sum(p.path.stat().st_size for p in self.parts)

    def chunks(self, start: int, end: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """Rows ``start..end`` in chunks of at most ``chunk_rows``, across part boundaries."""
        for part, (lo, hi) in zip(self.parts, zip(self.bounds[:-1], self.bounds[1:], strict=True), strict=True):
            a, b = max(start, int(lo)), min(end, int(hi))
            for s in range(a, b, chunk_rows):
                yield part.rows(s - int(lo), min(s + chunk_rows, b) - int(lo))


def flat_header(dim: int, ntotal: int, metric: str) -> bytes:
    """The bytes FAISS writes before the vectors of a flat index of this shape: an empty index
    serialised by FAISS itself, with its row count and block length set."""
    import faiss

    empty = faiss.IndexFlatIP(dim) if metric == "ip" else faiss.IndexFlatL2(dim)
    raw = bytearray(faiss.serialize_index(empty).tobytes())
    raw[8:16] = struct.pack("<q", ntotal)
    raw[-8:] = struct.pack("<Q", ntotal * dim)
    return bytes(raw)


def write_flat(path: Path, dim: int, metric: str, ntotal: int, chunks: Iterator[np.ndarray]) -> None:
    """Writes a flat FAISS file chunk by chunk; the memory used is one chunk's."""
    written = 0
    with open(path, "wb") as handle:
        handle.write(flat_header(dim, ntotal, metric))
        for chunk in chunks:
            # A view, not tobytes(): a copy would double the one chunk the import holds.
            handle.write(np.ascontiguousarray(chunk, dtype="<f4").data)
            written += len(chunk)
            del chunk  # before the next one is read, or two chunks are held at once
    if written != ntotal:
        raise ValueError(f"{path}: wrote {written} vectors, expected {ntotal}")
