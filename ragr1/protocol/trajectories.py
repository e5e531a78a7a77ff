"""The format-learning trajectories: what the model should write around the blocks the system inserts.

A trajectory is a list of ``(text, generated)`` pieces: think + search (generated), the information block
(inserted, built by ``information.InformationFormat`` exactly as the loop builds it), …, think + answer
(generated). The prompt, the tags and the information layout all come from this package, so SFT teaches
the token ids the policy's loop later shows the model.

``Searcher`` decides, round by round, what a trajectory searches, by rule, from what the model could know at
that point: a query is a supporting page's name that the question states (both entities of a comparison, the
subject of a PopQA question) or that a passage already shown states (a bridge entity); with neither, the
question itself. Multi-query mode searches every such name of a round in one call; single-query mode searches
one name a round, its first think naming every page the question states and the one searched first. A round
follows only for what the last one revealed, and none once an answer is in sight on a supporting page and
every name the question states has been searched. An alias that only some other passage states does not end
the search: a bridge question's first round often shows one beside passages that do not answer, and a
trajectory that stopped there would teach answering from a passage the model cannot tell from the others,
where reading the bridge entity's page is what the question needs. What comes back is whatever the retriever
returns (the caller searches: this package imports no client), and a trajectory is kept only where the
documents its blocks showed (cut to the per-query budget, as the model sees them) contain an answer alias, as
trajectories of a real search would be filtered.

In multi-query mode RL's parser (``grammar.parse_action``, RAG-R1's split) cuts a search at every
separator, so a name that holds one ("Paris, Texas") is searched with the separator replaced by a space;
each information block is built from the queries exactly as the parser reads them back, checked as the
block is built.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Sequence

from ragr1.protocol.grammar import parse_action
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import MAX_QUERIES, MAX_QUERY_CHARS, MAX_TURNS, QUERY_SEPARATOR, Mode

Piece = tuple[str, bool]

# Punctuation becomes a space, so that "Rankin's" still names "Rankin" and "Nobody's Hero" names itself.
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})
# A page's qualifier: "The Deep Blue Sea (1955 film)" is named "The Deep Blue Sea" in running text.
_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


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


def _words(text: str) -> str:
    """``text`` as lower-case words between spaces, for whole-word containment."""
    return " " + " ".join(text.lower().translate(_PUNCTUATION).split()) + " "


def names(title: str) -> list[str]:
    """The ways running text names the page ``title``: its title without a qualifier in brackets, and the
    part before its first comma ("Van Hook Township, Mountrail County, North Dakota" -> "Van Hook Township")."""
    bare = _QUALIFIER.sub("", title).strip() or title.strip()
    out = [bare]
    head = bare.split(",")[0].strip()
    if head and head != bare:
        out.append(head)
    return [n for n in out if _words(n).strip()]


def named_in(title: str, text: str) -> str | None:
    """The name of page ``title`` that ``text`` states as whole words, or None."""
    words = _words(text)
    return next((n for n in names(title) if _words(n) in words), None)


def contained_alias(answers: Sequence[str], texts: Sequence[str]) -> str | None:
    """The first answer alias some text states as whole words, or None."""
    shown = [_words(text) for text in texts]
    for alias in answers:
        words = _words(alias)
        if words.strip() and any(words in text for text in shown):
            return alias
    return None


@dataclasses.dataclass(frozen=True)
class SupportedQuestion:
    """A training question with the pages that answer it (HotpotQA/MuSiQue/PopQA train files)."""

    question: str
    # Every accepted answer alias.
    answers: list[str]
    # Titles of the supporting pages.
    gold: list[str]
    source: str = ""
    question_type: str = ""


class Searcher:
    """One trajectory's searches, decided round by round from what has been shown (see the module's doc).

    ``queries()`` gives the next round's queries ([] once the trajectory should answer); the caller searches
    them and hands the results to ``read``; ``pieces()`` is the finished response, ``None`` where the shown
    passages hold no answer alias."""

    def __init__(self, item: SupportedQuestion, mode: Mode, information: InformationFormat, *,
                 max_rounds: int = MAX_TURNS, max_queries: int = MAX_QUERIES,
                 separator: str = QUERY_SEPARATOR, max_query_chars: int = MAX_QUERY_CHARS) -> None:
        if mode is Mode.SEARCH_R1:
            raise ValueError(
                "no SFT trajectories in Search-R1's mode: Search-R1 trains with RL alone, from the base model"
            )
        self.item = item
        self.mode = mode
        self.information = information
        self.max_rounds = 0 if mode is Mode.NONE else max_rounds
        self.max_queries = max_queries if mode is Mode.MULTI else 1
        self.separator = separator
        self.max_query_chars = max_query_chars
        # Titles of the passages shown, the documents' text as the blocks showed it (cut to the budget), and
        # the shown part of each supporting page's passage.
        self.shown: set[str] = set()
        self.texts: list[str] = []
        self.supporting: list[str] = []
        self.searched: set[str] = set()  # gold titles searched
        self.rounds: list[list[str]] = []
        self._pieces: list[Piece] = []
        self._next = self._plan()

    # -- what to search -----------------------------------------------------------------------
    def _found(self, title: str) -> bool:
        return title in self.searched or title in self.shown

    def _plan(self) -> list[tuple[str, str]]:
        """(gold title, name to search) of every page the model could name now and has not found, the
        question's names first (in the order the question states them), then what passages revealed."""
        from_question = []
        for title in self.item.gold:
            name = named_in(title, self.item.question)
            if name is not None and not self._found(title):
                from_question.append((_words(self.item.question).find(_words(name)), title, name))
        revealed: list[tuple[str, str]] = []
        if contained_alias(self.item.answers, self.supporting) is not None:
            # An answer is in sight on a page that answers: only what the question names is still worth a round.
            return [(t, n) for _, t, n in sorted(from_question)]
        for title in self.item.gold:
            if self._found(title) or any(t == title for _, t, _ in from_question):
                continue
            name = next((n for text in self.texts if (n := named_in(title, text))), None)
            if name is not None:
                revealed.append((title, name))
        return [(t, n) for _, t, n in sorted(from_question)] + revealed

    def queries(self) -> list[str]:
        if len(self.rounds) >= self.max_rounds:
            return []
        if not self.rounds and not self._next:
            return [self._query(self.item.question)]  # nothing named yet: the question itself
        return [self._query(name) for _, name in self._next[: self.max_queries]]

    def _query(self, text: str) -> str:
        text = search_query(text, self.separator) if self.mode is Mode.MULTI else " ".join(text.split())
        return text[: self.max_query_chars]

    # -- what came back -----------------------------------------------------------------------
    def read(self, queries: Sequence[str], results: Sequence[Sequence[Passage]]) -> None:
        """The round that searched ``queries`` (as ``queries()`` gave them) and got ``results``."""
        multi = self.mode is Mode.MULTI
        searched = think(self._reason(queries)) + search_call(queries, self.separator)
        read = parse_action(searched, multi_query=multi, separator=self.separator,
                            max_queries=self.max_queries).queries
        if list(read) != list(queries):
            raise ValueError(f"SFT search {searched!r} reads as {list(read)}, not as the queries {list(queries)}")
        self._pieces.append((searched, True))
        self._pieces.append((self.information.block(queries, results, multi), False))
        planned = dict((self._query(name), title) for title, name in self._next)
        self.searched |= {planned[q] for q in queries if q in planned}
        # A passage the cut left out was not shown.
        shown = self.information.shown_passages(results, multi)
        self.shown |= {p.title for p, _ in shown}
        self.supporting += [text for p, text in shown if p.title in self.item.gold]
        self.texts += self.information.shown(results, multi)
        self.rounds.append(list(queries))
        self._next = self._plan()

    def _reason(self, queries: Sequence[str]) -> str:
        # The question searched as a query is not written out again: the think stays short, within a turn's
        # token budget beside the search itself.
        question = self._query(self.item.question)
        names = [q for q in queries if q != question]
        listed = " and ".join(names)
        if not self.rounds:
            if not names:
                return "I need to search for the question."
            stated = [self._query(n) for t, n in self._next if named_in(t, self.item.question) is not None]
            if len(stated) > len(names):
                # Fewer queries than pages the question states (single-query mode's one): the plan names them
                # all, so that the rounds that follow search the rest instead of answering after the first.
                return f"I need to know about {' and '.join(stated)}. I search for {listed} first."
            return f"I need to know about {listed}."
        revealed = [q for q in queries if named_in(q, self.item.question) is None]
        if revealed:
            return f"The documents mention {' and '.join(revealed)}. I need to know about {listed}."
        return f"I still need to know about {listed}."

    # -- the response --------------------------------------------------------------------------
    def pieces(self) -> list[Piece] | None:
        """The whole response, or None where the search showed no answer alias (no-retrieval mode answers
        with the first alias)."""
        if self.mode is Mode.NONE:
            said, conclusion = self.item.answers[0], "I know"
        else:
            found = contained_alias(self.item.answers, self.texts)
            if found is None:
                return None
            said, conclusion = found, "The documents show"
        return [*self._pieces, (think(f"{conclusion} the answer is {said}.") + answer(said), True)]
