"""IVF indexes (IVF-flat, IVF-PQ) split by row range into IVF shards that stay compressed.

Every shard is an IVF index with the source's trained coarse quantizer (and PQ codebooks) whose
inverted lists hold only the entries of its row range, their codes copied byte for byte and their ids
made local to the shard. A query probes the same ``nprobe`` lists in every shard as in the source
(same centroids), and the union of what the shards find in them is what the source finds: merged, the
top-k ids and scores are the source's. Nothing is re-trained or re-encoded.

FAISS itself parses the source: opened with ``IO_FLAG_MMAP`` it maps the file instead of reading the
lists, and gives every list's size and byte offset (``OnDiskInvertedLists``). The lists are then read
by ranges with ``pread``, not through the mapping, whose pages would count as the importer's resident
memory. A shard is assembled in memory (its codes and ids: the shard's compressed size) and written
by FAISS, so its file is exactly what FAISS writes for such an index.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

IVF_FOURCC = {b"IwFl": "ivfflat", b"IwPQ": "ivfpq"}
ID_BYTES = 8  # faiss.idx_t


class IvfLayoutError(ValueError):
    """An IVF file whose lists are not what FAISS's parse of it says, or ids that are not row numbers."""


def _mmapped(path: Path) -> tuple[Any, Any]:
    """The index read by FAISS without its list data (mapped, not read), and its IVF part."""
    import faiss

    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    return index, faiss.extract_index_ivf(index)


@dataclasses.dataclass(frozen=True)
class IvfSource:
    """Where one IVF file's inverted lists lie: per list, its entry count and its codes' byte offset
    (its ids follow its codes)."""

    path: Path
    code_size: int
    sizes: np.ndarray
    offsets: np.ndarray

    @classmethod
    def open(cls, path: Path) -> IvfSource:
        import faiss

        index, ivf = _mmapped(path)  # ``index`` owns ``ivf``: it must stay referenced while ``ivf`` is used
        lists = faiss.downcast_InvertedLists(ivf.invlists)
        if not isinstance(lists, faiss.OnDiskInvertedLists):
            raise IvfLayoutError(f"{path}: inverted lists of type {type(lists).__name__}, not FAISS's array lists")
        entries: Any = lists.lists  # a SWIG vector, indexed with at()
        sizes = np.array([entries.at(i).size for i in range(ivf.nlist)], dtype=np.int64)
        offsets = np.array([entries.at(i).offset for i in range(ivf.nlist)], dtype=np.int64)
        source = cls(Path(path), int(lists.code_size), sizes, offsets)
        source._check_against_faiss(lists)
        del index
        return source

    def _check_against_faiss(self, lists: Any) -> None:
        """The largest list's ids as read here must be FAISS's own (through its mapping: one list's pages)."""
        import faiss

        if not self.sizes.any():
            return
        biggest = int(np.argmax(self.sizes))
        n = int(self.sizes[biggest])
        theirs = faiss.rev_swig_ptr(lists.get_ids(biggest), n).copy()
        if not np.array_equal(self.ids(biggest), theirs):
            raise IvfLayoutError(f"{self.path}: list {biggest} read by range differs from FAISS's (unknown layout)")

    def ids(self, list_no: int) -> np.ndarray:
        n, offset = int(self.sizes[list_no]), int(self.offsets[list_no])
        return self._read(offset + n * self.code_size, n * ID_BYTES, "<i8")

    def codes(self, list_no: int) -> np.ndarray:
        n, offset = int(self.sizes[list_no]), int(self.offsets[list_no])
        return self._read(offset, n * self.code_size, np.uint8).reshape(n, self.code_size)

    def _read(self, offset: int, size: int, dtype: Any) -> np.ndarray:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            raw = os.pread(fd, size, offset)
        finally:
            os.close(fd)
        if len(raw) != size:
            raise IvfLayoutError(f"{self.path}: short read of {size} bytes at {offset} (truncated file?)")
        return np.frombuffer(raw, dtype=dtype)


def check_same_quantizer(first: Path, other: Path) -> None:
    """Parts of one IVF index must share the coarse centroids, or one query probes different lists in each."""
    first_index, a = _mmapped(first)
    other_index, b = _mmapped(other)
    if first_index.d != other_index.d or a.nlist != b.nlist or not np.array_equal(
        a.quantizer.reconstruct_n(0, a.nlist), b.quantizer.reconstruct_n(0, b.nlist)
    ):
        raise IvfLayoutError(f"{other} and {first} have different coarse quantizers: not parts of one IVF index")


def write_ivf_shard(parts: Sequence[tuple[Path, int]], path: Path, start: int, end: int) -> None:
    """Writes the IVF shard of global rows ``start..end`` of ``parts`` (each a file and its first global row).

    The source's ids must be its row numbers (``add``, not ``add_with_ids``): the shard counts its
    range's entries and refuses any other count, naming it.
    """
    import faiss

    template, ivf = _mmapped(parts[0][0])
    lists: Any = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    ivf.replace_invlists(lists, True)
    lists.this.disown()  # the index owns (and frees) it now
    ivf.make_direct_map(False)  # a source's id->entry map would describe rows this shard lacks
    count = 0
    for part_path, first_row in parts:
        source = IvfSource.open(part_path)
        lo, hi = start - first_row, end - first_row
        for list_no in np.flatnonzero(source.sizes):
            ids = source.ids(int(list_no))
            keep = (ids >= lo) & (ids < hi)
            if not keep.any():
                continue
            local = np.ascontiguousarray(ids[keep] + (first_row - start))
            codes = np.ascontiguousarray(source.codes(int(list_no))[keep])
            lists.add_entries(int(list_no), len(local), faiss.swig_ptr(local), faiss.swig_ptr(codes))
            count += len(local)
    if count != end - start:
        raise IvfLayoutError(
            f"rows {start}..{end}: the IVF lists hold {count} entries with those ids, not {end - start}: the "
            "index's ids are not its row numbers (built with add_with_ids?), so rows cannot be matched to the corpus"
        )
    ivf.ntotal = template.ntotal = count
    faiss.write_index(template, str(path))
