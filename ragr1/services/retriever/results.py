"""Search hits and the pure steps on them: merging shards' top-k, de-duplicating within groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ragr1.protocol.information import Passage


@dataclasses.dataclass(frozen=True)
class Hit(Passage):
    """A passage as a shard found it: its score and the shard that holds it."""

    shard: int = 0


def merge_top_k(
    per_shard: Sequence[Sequence[Sequence[Hit]]], k: int, lower_is_better: bool = False
) -> list[list[Hit]]:
    """``per_shard[s][q]`` is shard ``s``'s best-first list for query ``q``: the best ``k`` over shards.
    ``lower_is_better``: scores are distances (an L2 index), not similarities.

    The sort is stable over shards in row order, so equal scores come out lowest row first, as one
    unsharded flat index orders them.
    """
    if not per_shard:
        return []
    num_queries = len(per_shard[0])
    merged = []
    for q in range(num_queries):
        candidates = [hit for shard in per_shard for hit in shard[q]]
        candidates.sort(key=lambda h: h.score if lower_is_better else -h.score)
        merged.append(candidates[:k])
    return merged


def dedup_within_groups(
    results: Sequence[Sequence[Hit]], groups: Sequence[int], k: int, lower_is_better: bool = False
) -> list[list[Hit]]:
    """No passage twice among the queries of one group; each query keeps up to ``k`` hits.

    Hits of a group are dealt out best score first: a passage goes to the query that scores it
    highest unless that query already holds ``k`` better ones. With ``k * group size`` candidates per
    query every query still gets ``k`` (its siblings can take at most ``k * (size - 1)``).
    """
    out: list[list[Hit]] = [[] for _ in results]
    taken: set[tuple[int, str]] = set()
    ranked = sorted(
        ((hit.score, q, rank) for q, hits in enumerate(results) for rank, hit in enumerate(hits)),
        key=lambda t: (t[0] if lower_is_better else -t[0], t[1], t[2]),
    )
    for _, q, rank in ranked:
        hit = results[q][rank]
        key = (groups[q], hit.id)
        if len(out[q]) < k and key not in taken:
            taken.add(key)
            out[q].append(hit)
    return out
