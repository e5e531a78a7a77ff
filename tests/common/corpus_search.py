"""A retriever that knows every answer: each query gets the shipped corpus's page whose title or name it is (none
otherwise). For tests of what is built from passages, not of retrieval (the real retriever's trajectories:
tests/trainer/test_sft_search.py)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import Mode
from ragr1.protocol.trajectories import Searcher, SupportedQuestion, names
from ragr1.services.trainer.data import SFTTrajectory
from ragr1.services.trainer.sft_search import search_trajectories
from ragr1.shipped import corpus_path, read_jsonl


@functools.cache
def pages() -> dict[str, Passage]:
    return {r["title"]: Passage(r["id"], r["title"], r["text"]) for r in read_jsonl(corpus_path())}


@functools.cache
def by_name() -> dict[str, Passage]:
    """Each page under its title and its names (the first page of a name wins)."""
    out: dict[str, Passage] = {}
    for title, page in pages().items():
        for name in (title, *names(title)):
            out.setdefault(name, page)
    return out


def named_questions(path: Any, n: int) -> list[SupportedQuestion]:
    """The first ``n`` questions of a training file that name a supporting page: those this retriever, which
    knows pages by name only, can answer."""
    from ragr1.protocol.trajectories import named_in
    from ragr1.services.trainer.data import load_supported_questions

    items = [q for q in load_supported_questions(path) if any(named_in(t, q.question) for t in q.gold)]
    return items[:n]


def search(queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
    """``sft_search.Search`` over the pages by name."""
    return [[by_name()[q]] if q in by_name() else [] for q in queries]


def run(item: SupportedQuestion, mode: Mode, information: InformationFormat) -> Searcher:
    s = Searcher(item, mode, information)
    while queries := s.queries():
        s.read(queries, search(queries, [0] * len(queries)))
    return s


def trajectories(items: Sequence[SupportedQuestion], modes: Sequence[str], tokenizer: Any,
                 tokens_per_query: int) -> list[SFTTrajectory]:
    """The kept trajectory of every question and mode, searched as SFT searches the stack's retriever."""
    return search_trajectories(items, modes, InformationFormat(tokenizer, tokens_per_query), search).trajectories
