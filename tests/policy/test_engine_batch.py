"""``streaming.EngineBatch``: how many trajectories a rollout worker keeps running by default: its engine's batch,
counted with the length trajectories reach (the engine's own rule, ``engine.batch_of``, on a KV cache of a given
size; the rule's own test: tests/policy/test_engine.py)."""

from __future__ import annotations

from ragr1.services.policy.engine import batch_of
from ragr1.services.policy.streaming import EngineBatch


def test_the_batch_starts_at_the_longest_trajectory_then_follows_the_mean_length_of_the_last_ones() -> None:
    cache = 46_603
    batch = EngineBatch(lambda tokens: batch_of(64, cache, tokens), longest=8_000, window=4)
    assert batch.size == 5  # before any trajectory ended: each may reach 8,000 tokens
    for tokens in (1_500, 2_500):
        batch.ended(tokens)
    assert batch.size == cache // 2_000 == 23
    for tokens in (500, 500, 500, 500):  # the first two left the window
        batch.ended(tokens)
    assert batch.size == 64  # short trajectories: the engine's max_num_seqs limits
    for _ in range(4):
        batch.ended(20_000)  # longer than the loop allows (never): counted as the longest
    assert batch.size == 5
