"""SFT trajectories searched through the retriever, as a rollout searches.

Every trajectory's rounds are decided by ``ragr1.protocol.trajectories.Searcher`` (what the model could name
at that point); here they are searched in lock step, as the loop's lock-step turn does: one retriever call a
round carries the queries of every trajectory still searching, each trajectory its own group, so a passage
appears once per trajectory's call (``dedup_within_group``, as the loop asks). What comes back goes into the
information block as the loop lays it out. A trajectory whose passages never showed an answer alias is
dropped, and counted.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

from ragr1.errors import ServiceCallError
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import MAX_TURNS, Mode
from ragr1.protocol.trajectories import Searcher, SupportedQuestion
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.trainer.data import SFTTrajectory

# The queries of one trajectory's group, one list of passages per query.
Search = Callable[[Sequence[str], Sequence[int]], list[list[Passage]]]
# Trajectories per retriever call: well under the router's query limit at three queries each.
CALL_TRAJECTORIES = 64


def retriever_search(client: RetrieverClient, top_k: int, timeout: float = 60.0) -> Search:
    """``Search`` over ``Retriever.Search``, as the policy's backend calls it."""

    def search(queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        reply = client.search(queries, top_k, groups=groups, dedup_within_group=True, timeout=timeout)
        return [[Passage(p.id, p.title, p.text, p.score) for p in r.passages] for r in reply.results]

    return search


@dataclasses.dataclass
class Searched:
    """The kept trajectories and, by (source, question type, mode), how many were built and kept."""

    trajectories: list[SFTTrajectory]
    built: Counter[tuple[str, str, str]]
    kept: Counter[tuple[str, str, str]]

    def summary(self) -> list[dict[str, object]]:
        return [{"source": s, "question_type": t, "mode": m, "built": n, "kept": self.kept[(s, t, m)]}
                for (s, t, m), n in sorted(self.built.items())]


def search_trajectories(
    items: Sequence[SupportedQuestion],
    modes: Sequence[str],
    information: InformationFormat,
    search: Search,
    *,
    max_rounds: int = MAX_TURNS,
) -> Searched:
    """One trajectory per question and mode, searched through ``search``; those that showed no answer
    alias are left out (``Searched.kept`` says how many were kept)."""
    searchers = [Searcher(item, Mode.parse(mode), information, max_rounds=max_rounds)
                 for item in items for mode in modes]
    waiting = [(s, q) for s in searchers if (q := s.queries())]
    while waiting:
        for start in range(0, len(waiting), CALL_TRAJECTORIES):
            chunk = waiting[start : start + CALL_TRAJECTORIES]
            queries = [q for _, asked in chunk for q in asked]
            groups = [i for i, (_, asked) in enumerate(chunk) for _ in asked]
            results = search(queries, groups)
            if len(results) != len(queries):
                raise RuntimeError(f"the retriever answered {len(results)} of {len(queries)} queries")
            at = 0
            for searcher, asked in chunk:
                searcher.read(asked, results[at : at + len(asked)])
                at += len(asked)
        waiting = [(s, q) for s, _ in waiting if (q := s.queries())]
    out = Searched([], Counter(), Counter())
    for s in searchers:
        key = (s.item.source, s.item.question_type, s.mode.value)
        out.built[key] += 1
        pieces = s.pieces()
        if pieces is None:
            continue
        out.kept[key] += 1
        out.trajectories.append(SFTTrajectory(
            s.item.question, s.mode, pieces, s.item.source, s.item.question_type,
            rounds=len(s.rounds), queries=sum(len(r) for r in s.rounds),
        ))
    return out


def search_through(address: str, items: Sequence[SupportedQuestion], modes: Sequence[str],
                   information: InformationFormat, *, top_k: int, max_rounds: int = MAX_TURNS,
                   what: str = "the SFT trajectories") -> Searched:
    """``search_trajectories`` through the retriever at ``address``; one that does not answer is named in a
    ``ValueError`` before anything is searched."""
    with RetrieverClient(address) as client:
        try:
            serving, why = client.health(timeout=30.0), "not serving"
        except ServiceCallError as exc:
            serving, why = False, str(exc)
        if not serving:
            raise ValueError(f"{what} search the retriever at {address} ({why}); start one (ragr1 up) or give "
                             "a trajectories file that ragr1 data prepare wrote")
        return search_trajectories(items, modes, information, retriever_search(client, top_k),
                                   max_rounds=max_rounds)
