"""Where the shipped data lives and how to read it (JSONL, gzipped or not).

``data/`` at the repository root holds the corpus and the question files (see ``data/README.md``).
``RAGR1_DATA_DIR`` points elsewhere, e.g. at a user's own copy in the same layout.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVAL_BENCHMARKS = ("nq", "tq", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
TRAIN_SETS = ("hotpotqa", "musique", "popqa")

# What a question asks of search: one fact ("single-hop"), a chain whose next entity is only known from the
# passage before ("bridge"), or the same fact of entities the question names, looked up side by side
# ("comparison", where parallel queries pay). "" when a record does not say.
SINGLE_HOP, BRIDGE, COMPARISON = "single-hop", "bridge", "comparison"
QUESTION_TYPES = (SINGLE_HOP, BRIDGE, COMPARISON)
# The question type of each data set's own ``type`` labels: HotpotQA's and 2WikiMultiHopQA's by name;
# MuSiQue's ``2hop``, ``3hop1``, ``4hop3`` … are chains of composed facts (bridges).
_TYPE_LABELS = {
    "bridge": BRIDGE, "comparison": COMPARISON,
    "compositional": BRIDGE, "inference": BRIDGE, "bridge_comparison": COMPARISON,
}
_HOPS = re.compile(r"\d+hop\d*")
# PopQA's relations: each question asks one relation of one subject.
POPQA_RELATIONS = frozenset({
    "occupation", "place of birth", "genre", "father", "country", "producer", "director", "capital of",
    "screenwriter", "composer", "color", "religion", "sport", "author", "mother", "capital",
})
# Data sets whose every question is of one type by construction, for records that carry no label (the
# evaluation files): PopQA fills one relation template, MuSiQue composes single-hop questions into chains.
_SOURCE_TYPES = {"popqa": SINGLE_HOP, "musique": BRIDGE}


def data_dir() -> Path:
    return Path(os.environ.get("RAGR1_DATA_DIR", ROOT / "data"))


def _find(relative: str) -> Path:
    base = data_dir()
    for candidate in (base / relative, base / (relative + ".gz")):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{base / relative}(.gz) not found; set RAGR1_DATA_DIR to the data folder")


def corpus_path() -> Path:
    return _find("corpus/wiki_passages.jsonl")


def train_path(name: str) -> Path:
    if name not in TRAIN_SETS:
        raise ValueError(f"unknown training set {name!r}; known: {', '.join(TRAIN_SETS)}")
    return _find(f"train/{name}.jsonl")


def train_source(name_or_path: str) -> Path:
    """A shipped training set by name, or a user's file of the same layout by path."""
    if name_or_path in TRAIN_SETS:
        return train_path(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a file, nor a shipped training set ({', '.join(TRAIN_SETS)})")
    return path


def eval_path(name: str) -> Path:
    if name not in EVAL_BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(EVAL_BENCHMARKS)}")
    return _find(f"eval/{name}.jsonl")


def record_source(record: Mapping[str, Any], path: Path) -> str:
    """The data set a QA record belongs to: its ``data_source`` (Search-R1's field, the evaluation files'),
    else its ``dataset`` (the training files'), else its file's name without extensions."""
    return str(record.get("data_source") or record.get("dataset") or Path(path).name.split(".")[0])


def question_type(record: Mapping[str, Any], source: str = "") -> str:
    """The type of a QA record's question (``QUESTION_TYPES``, or "" when unknown): its own
    ``question_type`` when it carries one (a file this project wrote), else its data set's ``type`` label
    (``_TYPE_LABELS``, MuSiQue's hop counts, PopQA's relations), else what its data set's questions all are
    (``source``, by default the record's ``data_source`` or ``dataset``)."""
    if record.get("question_type"):
        return str(record["question_type"])
    label = str(record.get("type") or "").strip().lower()
    if label in _TYPE_LABELS:
        return _TYPE_LABELS[label]
    if _HOPS.fullmatch(label):
        return BRIDGE
    if label in POPQA_RELATIONS:
        return SINGLE_HOP
    source = source or str(record.get("data_source") or record.get("dataset") or "")
    return _SOURCE_TYPES.get(source.strip().lower(), "")


def read_jsonl(path: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yields one dict per non-empty line; a bad line raises ValueError naming the file and line."""
    for _lineno, record in read_jsonl_numbered(path, limit):
        yield record


def read_jsonl_numbered(path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Like ``read_jsonl``, with each record's line number (for errors that name the line)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        count = 0
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record
            count += 1
            if limit is not None and count >= limit:
                return


def cache_dir() -> Path:
    """Where prepared models, indexes and other derived files are cached (``RAGR1_CACHE_DIR``)."""
    path = Path(os.environ.get("RAGR1_CACHE_DIR", ROOT / ".cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(target: Path) -> Iterator[None]:
    """Holds an exclusive lock on the cache entry ``target`` (a ``.<name>.lock`` file beside it) while a
    process checks for it and builds it when missing. Processes sharing the cache (test workers, services
    started at once) then build an entry once between them instead of all at once: the waiters find it
    finished. The kernel drops the lock when its holder dies, so a crashed builder blocks no one; what it
    left half-written must still be recognisable as unfinished (written to a temporary name and moved
    into place, or completed by a file written last), since no lock says so after the crash."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def move_into_place(tmp: Path, target: Path) -> None:
    """Renames a finished cache entry ``tmp`` to ``target``, atomically. If another process sharing the
    cache (two pods on one volume, two services started at once) put ``target`` there first, keeps
    theirs and removes ``tmp``."""
    try:
        tmp.rename(target)
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def all_questions() -> list[str]:
    """Every distinct question of the shipped training and evaluation sets, in file order."""
    paths = [train_path(n) for n in TRAIN_SETS] + [eval_path(n) for n in EVAL_BENCHMARKS]
    seen: dict[str, None] = {}
    for path in paths:
        for record in read_jsonl(path):
            seen.setdefault(record["question"], None)
    return list(seen)
