"""Corpus ingestion and the on-disk passage store.

A store is a directory with ``passages.jsonl`` (one ``{"id", "title", "text"}`` object per line, in
row order) and ``offsets.npy`` (``num_passages + 1`` byte offsets into it). Servers memory-map the
offsets and read one line per hit with ``os.pread``, so a 21M-passage corpus never sits in RAM.
``store.json`` records the passage count and the SHA-256 of the passages file, which index manifests
copy so that a shard can tell that it serves the store its index was built from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ragr1.protocol.information import Passage
from ragr1.shipped import read_jsonl

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "offsets.npy"
META_FILE = "store.json"
CORPUS_FORMATS = ("jsonl", "kilt")
# RAG-R1 and Search-R1 retrieve from Wikipedia split into passages of this many words.
KILT_WORDS_PER_PASSAGE = 100
# KILT paragraphs that only mark structure ("Section::::History.", "BULLET::::- ...").
_KILT_MARKUP = re.compile(r"^(Section|BULLET)::::-?\s*")


def record_from_json(record: dict[str, Any], where: str) -> Passage:
    """Reads ``title`` + ``text``, or ``contents`` (``"Title"\\ntext``); ``where`` names the line on error."""
    pid = str(record.get("id", "")).strip()
    if not pid:
        raise ValueError(f"{where}: passage has no 'id'")
    if "text" in record and "title" in record:
        return Passage(pid, str(record["title"]), str(record["text"]))
    if "contents" in record:
        title, _, text = str(record["contents"]).partition("\n")
        return Passage(pid, title.strip().strip('"'), text)
    raise ValueError(f"{where}: passage {pid} has neither 'contents' nor 'title' and 'text'")


def split_kilt_page(page: dict[str, Any], words: int = KILT_WORDS_PER_PASSAGE) -> list[Passage]:
    """One KILT knowledge-source page as passages of ``words`` words, ids ``<wikipedia_id>_<n>``.

    KILT pages are ``{"wikipedia_id", "wikipedia_title", "text": [paragraph, ...]}`` whose first
    paragraph repeats the title; section markers are dropped and the rest is cut into fixed-size
    word windows, as in DPR's and RAG-R1's Wikipedia passages.
    """
    if words <= 0:
        raise ValueError(f"words per passage must be positive, got {words}")
    title = str(page.get("wikipedia_title", "")).strip()
    page_id = str(page.get("wikipedia_id", page.get("_id", ""))).strip()
    if not page_id:
        raise ValueError(f"KILT page {title!r} has no 'wikipedia_id'")
    paragraphs = list(page.get("text", []))
    if paragraphs and paragraphs[0].strip() == title:
        paragraphs = paragraphs[1:]
    tokens: list[str] = []
    for paragraph in paragraphs:
        if paragraph.startswith("Section::::"):
            continue
        tokens += _KILT_MARKUP.sub("", paragraph).split()
    return [
        Passage(f"{page_id}_{n}", title, " ".join(tokens[start : start + words]))
        for n, start in enumerate(range(0, len(tokens), words))
    ]


def read_corpus(
    paths: Iterable[Path], fmt: str = "jsonl", words: int = KILT_WORDS_PER_PASSAGE, limit: int | None = None
) -> Iterator[Passage]:
    if fmt not in CORPUS_FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}; known: {', '.join(CORPUS_FORMATS)}")
    count = 0
    for path in paths:
        for lineno, record in enumerate(read_jsonl(Path(path)), start=1):
            passages = (
                split_kilt_page(record, words) if fmt == "kilt" else [record_from_json(record, f"{path}:{lineno}")]
            )
            for passage in passages:
                yield passage
                count += 1
                if limit is not None and count >= limit:
                    return


def write_store(passages: Iterable[Passage], out_dir: Path, *, progress: bool = True) -> PassageStore:
    """Writes a store (to temporary names, renamed at the end: a crash leaves no half store)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_passages = out_dir / (PASSAGES_FILE + ".tmp")
    offsets = [0]
    seen: set[str] = set()
    digest = hashlib.sha256()
    with open(tmp_passages, "wb") as handle:
        for passage in tqdm(passages, desc="ingest", unit=" passages", disable=not progress):
            if passage.id in seen:
                raise ValueError(f"duplicate passage id {passage.id!r}")
            seen.add(passage.id)
            row = {"id": passage.id, "title": passage.title, "text": passage.text}  # no score: stored, not found
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode()
            handle.write(line)
            digest.update(line)
            offsets.append(offsets[-1] + len(line))
    if len(offsets) == 1:
        tmp_passages.unlink()
        raise ValueError("the corpus has no passages")
    with open(out_dir / (OFFSETS_FILE + ".tmp"), "wb") as handle:
        np.save(handle, np.asarray(offsets, dtype=np.uint64))
    meta = {"num_passages": len(offsets) - 1, "sha256": digest.hexdigest()}
    (out_dir / (META_FILE + ".tmp")).write_text(json.dumps(meta, indent=2))
    for name in (PASSAGES_FILE, OFFSETS_FILE, META_FILE):
        os.replace(out_dir / (name + ".tmp"), out_dir / name)
    return PassageStore(out_dir)


class PassageStore:
    """Random access to passages by row; thread-safe (``pread`` has no shared file position)."""

    def __init__(self, directory: Path) -> None:
        self._fd = -1
        self.directory = Path(directory)
        for name in (PASSAGES_FILE, OFFSETS_FILE, META_FILE):
            if not (self.directory / name).exists():
                raise FileNotFoundError(
                    f"{self.directory / name} missing: not a passage store (build one with `ragr1 corpus ingest`)"
                )
        self.meta: dict[str, Any] = json.loads((self.directory / META_FILE).read_text())
        self._offsets = np.load(self.directory / OFFSETS_FILE, mmap_mode="r")
        if len(self._offsets) != self.meta["num_passages"] + 1:
            raise ValueError(f"{self.directory}: {OFFSETS_FILE} does not match {META_FILE}")
        self._fd = os.open(self.directory / PASSAGES_FILE, os.O_RDONLY)

    @property
    def sha256(self) -> str:
        return str(self.meta["sha256"])

    def __len__(self) -> int:
        return int(self.meta["num_passages"])

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"passage row {row} outside [0, {len(self)})")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return Passage(**json.loads(os.pread(self._fd, end - start, start)))

    def __iter__(self) -> Iterator[Passage]:
        for row in range(len(self)):
            yield self[row]

    def iter_range(self, start: int, end: int) -> Iterator[Passage]:
        for row in range(start, end):
            yield self[row]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()
