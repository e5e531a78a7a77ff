"""The format-learning trajectories: what the model should write around the blocks the system inserts.

A trajectory is a list of ``(text, generated)`` pieces: think + search (generated), the information block
(inserted, built by ``information.InformationFormat`` exactly as the loop builds it), …, think + answer
(generated). The prompt, the tags and the information layout all come from this package, so SFT teaches
the token ids the policy's loop later shows the model.

Each search queries the titles of the supporting paragraphs. In multi-query mode RL's parser
(``grammar.parse_action``, RAG-R1's split) cuts a search at every separator, so a title that holds one
("Paris, Texas") is searched with the separator replaced by a space; each information block is then built
from the queries exactly as the parser reads them back, which is checked as the block is built.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from ragr1.protocol.grammar import parse_action
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import MAX_QUERIES, QUERY_SEPARATOR, Mode

Piece = tuple[str, bool]


def think(text: str) -> str:
    return f"<think> {text} </think>\n"


def search_call(queries: Sequence[str], separator: str = QUERY_SEPARATOR) -> str:
    return "<search> " + f"{separator} ".join(queries) + " </search>"


def search_query(title: str, separator: str = QUERY_SEPARATOR) -> str:
    """``title`` as one multi-query search query: the separator, which would split it into several queries,
    becomes a space ("Alice River, Queensland" -> "Alice River Queensland")."""
    text = title.replace(separator, " ") if separator else title
    return " ".join(text.split())


def answer(text: str) -> str:
    return f"<answer> {text} </answer>"


@dataclasses.dataclass(frozen=True)
class SupportedQuestion:
    """A training question with the paragraphs that answer it (HotpotQA/MuSiQue/PopQA train files)."""

    question: str
    answer: str
    # (title, text) of each supporting paragraph, in the order a search should find them.
    gold: list[tuple[str, str]]
    # Non-supporting paragraphs, to fill each query's top-k as a retriever would.
    distractors: list[tuple[str, str]]


def _results(item: SupportedQuestion, call: Sequence[tuple[str, str]], top_k: int,
             rng: random.Random) -> list[list[Passage]]:
    """One top-k list per query: the gold paragraph first, then distractors."""
    results = []
    for paragraph in call:
        fill = rng.sample(item.distractors, min(top_k - 1, len(item.distractors)))
        results.append([Passage("", title, text) for title, text in [paragraph, *fill]])
    return results


def trajectory(
    item: SupportedQuestion,
    mode: Mode,
    information: InformationFormat,
    *,
    top_k: int,
    max_queries: int = MAX_QUERIES,
    separator: str = QUERY_SEPARATOR,
    seed: int = 0,
) -> list[Piece]:
    """The response as pieces. Multi-query mode searches every supporting title in one call (at most
    ``max_queries`` per call); single-query mode searches them one at a time; no-retrieval mode answers."""
    if mode is Mode.SEARCH_R1:
        raise ValueError("no SFT trajectories in Search-R1's mode: Search-R1 trains with RL alone, from the base model")
    rng = random.Random(f"{seed}:{item.question}")
    gold = item.gold
    if mode is Mode.NONE:
        calls: list[list[tuple[str, str]]] = []
    elif mode is Mode.MULTI:
        calls = [gold[i : i + max_queries] for i in range(0, len(gold), max_queries)]
    else:
        calls = [[g] for g in gold]
    multi = mode is Mode.MULTI
    pieces: list[Piece] = []
    for n, call in enumerate(calls):
        queries = [search_query(t, separator) if multi else t.strip() for t, _ in call]
        reason = (
            f"I need to know about {', '.join(queries)} to answer the question."
            if n == 0
            else f"I still need to know about {', '.join(queries)}."
        )
        searched = think(reason) + search_call(queries, separator)
        read = parse_action(searched, multi_query=multi, separator=separator, max_queries=max_queries).queries
        if list(read) != queries:
            raise ValueError(f"SFT search {searched!r} reads as {list(read)}, not as the queries {queries}")
        pieces.append((searched, True))
        block = information.block(queries, _results(item, call, top_k, rng), multi)
        pieces.append((block, False))
    conclusion = "The documents show" if calls else "I know"
    pieces.append((think(f"{conclusion} the answer is {item.answer}.") + answer(item.answer), True))
    return pieces
