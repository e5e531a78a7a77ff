"""The ``<information>`` block the system inserts after a search, laid out as RAG-R1 lays it out.

- Single-query mode (RAG-R1's ``generation_sq.py``): the query's top-k documents, ``Doc i: "Title"\ntext``
  one after another.
- Multi-query mode (RAG-R1's ``generation_mq.py``): a JSON object ``{"query": [q1, q2, …],
  "documents": [docs of q1, docs of q2, …]}`` (indent 2), so the model sees which documents answer
  which query.

Each query's documents are cut to ``tokens_per_query`` tokens separately (RAG-R1's ``max_obs_length``,
applied per query), so the third query of a search gets the same room as the first. One deviation:
the JSON keeps non-ASCII characters as they are (RAG-R1's ``json.dumps`` escapes them to ``\\uXXXX``,
which a model would then have to copy into its answer, and exact match compares accents).

Search-R1's mode lays the block out as Search-R1's generation loop does: ``Doc i(Title: "Title") text``
lines (the title is the ``contents``' first line, quotes and all) between ``\n\n<information>`` and
``</information>\n\n``, the whole block cut to its ``max_obs_length`` (500 tokens) from the start.

The policy's loop and the SFT trajectories both build the block here, with the same tokenizer, so the
model is trained on the token ids it is later shown.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from ragr1.protocol.grammar import INFORMATION_CLOSE, INFORMATION_OPEN
from ragr1.protocol.prompts import Tokenizer

# RAG-R1 retrieves the top 3 documents per query.
TOP_K = 3
# RAG-R1 cuts each query's documents to 1,000 tokens for Qwen2.5-7B (32k context). The default model here,
# SmolLM2-135M, has an 8k context: 480 tokens hold the top 3 passages of the shipped corpus most of the
# time (median passage 110 tokens, 90th percentile 260) and let 4 searches of 3 queries fit in 8,192.
TOKENS_PER_QUERY = 480


@dataclasses.dataclass(frozen=True)
class Passage:
    """One retrieved passage, as the loop needs it (the retriever's protobuf Passage, unwrapped)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The DPR/FlashRAG ``contents`` layout that RAG-R1's retrieval server returns."""
        return f'"{self.title}"\n{self.text}'


def documents(passages: Sequence[Passage]) -> str:
    """One query's documents, numbered from 1."""
    return "\n".join(f"Doc {i}: {p.contents}" for i, p in enumerate(passages, start=1))


# Search-R1's data.max_obs_length (train_ppo.sh, evaluate.sh): tokens of one whole inserted block.
SEARCH_R1_OBS_TOKENS = 500


def search_r1_documents(passages: Sequence[Passage]) -> str:
    """Every passage of a search as Search-R1's ``_passages2string`` writes it."""
    return "".join(f"Doc {i}(Title: {p.contents.split(chr(10))[0]}) {p.text}\n" for i, p in enumerate(passages, 1))


class InformationFormat:
    """Builds information blocks with one tokenizer and one per-query budget (0 = no cut)."""

    def __init__(self, tokenizer: Tokenizer, tokens_per_query: int) -> None:
        if tokens_per_query < 0:
            raise ValueError(f"tokens_per_query must be >= 0, got {tokens_per_query}")
        self.tokenizer = tokenizer
        self.tokens_per_query = tokens_per_query

    def cut(self, text: str) -> str:
        """``text`` cut to the per-query budget, as RAG-R1 cuts it (token ids, decoded back)."""
        if self.tokens_per_query == 0:
            return text
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.tokens_per_query:
            return text
        return self.tokenizer.decode(ids[: self.tokens_per_query], skip_special_tokens=True)

    def shown(self, results: Sequence[Sequence[Passage]], multi_query: bool) -> list[str]:
        """The documents as the block shows them, cut: one text per query in multi-query mode, one for all."""
        if not multi_query:
            return [self.cut(documents([p for passages in results for p in passages]))]
        return [self.cut(documents(passages)) for passages in results]

    def shown_passages(self, results: Sequence[Sequence[Passage]], multi_query: bool) -> list[tuple[Passage, str]]:
        """Each passage whose title line the cut left in, with the part of its text the block shows."""
        groups = [list(r) for r in results] if multi_query else [[p for r in results for p in r]]
        out: list[tuple[Passage, str]] = []
        for passages, text in zip(groups, self.shown(results, multi_query), strict=True):
            at = 0
            for i, passage in enumerate(passages, start=1):
                head = f'Doc {i}: "{passage.title}"\n'
                start = text.find(head, at)
                if start < 0:
                    break  # the cut ends before this document's text: neither it nor any after it is shown
                at = start + len(head)
                following = text.find(f"\nDoc {i + 1}: ", at)
                out.append((passage, text[at : following if following >= 0 else len(text)]))
        return out

    def body(self, queries: Sequence[str], results: Sequence[Sequence[Passage]], multi_query: bool) -> str:
        if len(queries) != len(results):
            raise ValueError(f"{len(queries)} queries but {len(results)} result lists")
        shown = self.shown(results, multi_query)
        if not multi_query:
            return shown[0]
        return json.dumps({"query": list(queries), "documents": shown}, indent=2, ensure_ascii=False)

    def block(self, queries: Sequence[str], results: Sequence[Sequence[Passage]], multi_query: bool) -> str:
        """The whole inserted text: ``\\n<information>\\n`` body ``\\n</information>\\n``."""
        return INFORMATION_OPEN + self.body(queries, results, multi_query) + INFORMATION_CLOSE

    def search_r1_block(self, results: Sequence[Sequence[Passage]]) -> str:
        """Search-R1's inserted text for one search, cut as it cuts it (token ids from the start, decoded)."""
        docs = search_r1_documents([p for passages in results for p in passages])
        text = f"\n\n<information>{docs.strip()}</information>\n\n"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= SEARCH_R1_OBS_TOKENS:
            return text
        return self.tokenizer.decode(ids[:SEARCH_R1_OBS_TOKENS], skip_special_tokens=True)
