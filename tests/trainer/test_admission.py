"""Admission control on a real Redis: prompts are queued only within the staleness window, settling counts
rollouts out of it, and a finished run takes back the prompts no worker has taken."""

from __future__ import annotations

from typing import Any

import redis

from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.trainer.config import PPOConfig
from ragr1.services.trainer.loop.admission import Admission
from ragr1.v1 import common_pb2
from tests.trainer.rollouts import make_rollout, produce

TASKS = [common_pb2.PromptTask(id=f"t{i}", question=f"question {i}?", golden_answers=["x"]) for i in range(3)]


def admission(client: redis.Redis, **overrides: Any) -> Admission:
    config = PPOConfig(**{"batch_size": 4, "mini_batch_size": 2, "max_staleness": 1, **overrides})
    prompts: StreamQueue[Any] = StreamQueue(client, PROMPTS, common_pb2.PromptTask, group=config.group)
    rollouts: StreamQueue[Any] = StreamQueue(
        client, ROLLOUTS, common_pb2.Rollout, group=config.group, consumer=config.consumer
    )
    prompts.ensure_group()
    rollouts.ensure_group()
    return Admission(config, client, prompts, rollouts, TASKS)


def queued(client: redis.Redis) -> list[common_pb2.PromptTask]:
    return [common_pb2.PromptTask.FromString(f[b"data"]) for _, f in client.xrange(PROMPTS)]


def test_admission_control_keeps_the_staleness_window(redis_client: redis.Redis) -> None:
    gate = admission(redis_client, batch_size=4, max_staleness=1)
    assert gate.feed(version=3) == 8  # (S + 1) x batch
    assert gate.feed(version=3) == 0  # nothing settled yet: no more room
    tasks = queued(redis_client)
    assert len({t.id for t in tasks}) == 8
    assert all(t.admitted_at_version == 3 for t in tasks)
    assert [t.question for t in tasks[:4]] == ["question 0?", "question 1?", "question 2?", "question 0?"]
    redis_client.hincrby(gate.counters, "settled", 4)  # one batch trained
    assert gate.feed(version=4) == 4
    # Prompts a rollout worker gives up on (dead-lettered) will never bring rollouts: they leave the
    # window too, or enough of them would stop training for good.
    worker = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="rollout-workers")
    worker.ensure_group()
    for d in worker.consume(2):
        worker.dead_letter(d.entry_id, {"id": d.message.id, "data": d.message.SerializeToString()}, "retrieval_error")
    assert gate.feed(version=4) == 2
    # So does a rollout the trainer dead-letters (the loop's validate hook): it will never be trained.
    produce(redis_client, [make_rollout("bad")])
    gate.rollouts.validate = lambda rollout: "broken"
    assert gate.rollouts.consume(1) == []
    assert gate.feed(version=4) == 1


def test_a_prompt_admits_all_its_samples_and_each_run_numbers_its_own_tasks(redis_client: redis.Redis) -> None:
    first = admission(redis_client, batch_size=4, max_staleness=1, samples_per_prompt=2)
    assert first.feed(version=0) == 4  # a window of 8 rollouts, two per prompt
    assert int(redis_client.hget(first.counters, "admitted") or 0) == 8
    tasks = queued(redis_client)
    assert all(t.num_samples == 2 and t.group_id == t.id for t in tasks)
    # A trainer restarted on the same Redis continues the count but not the ids: rollout ids derive from
    # task ids, and those of the earlier run are marked done.
    redis_client.hincrby(first.counters, "settled", 8)
    second = admission(redis_client, batch_size=4, max_staleness=1, samples_per_prompt=2)
    assert second.feed(version=0) == 4
    ids = [t.id for t in queued(redis_client)]
    assert len(set(ids)) == 8
    assert [i.rsplit("-", 1)[1] for i in ids] == [str(n) for n in range(8)]
    assert {i.split("#")[1].split("-")[0] for i in ids} == {first.run_id, second.run_id}


def test_settling_acknowledges_and_counts_only_admitted_rollouts(redis_client: redis.Redis) -> None:
    gate = admission(redis_client)
    produce(redis_client, [make_rollout(f"r{i}") for i in range(3)])
    first, second, copy = gate.rollouts.consume(3)
    gate.settle([first, second])
    assert int(redis_client.hget(gate.counters, "settled") or 0) == 2
    assert gate.rollouts.is_done("r0") and gate.rollouts.is_done("r1")
    # A second copy of a buffered rollout was never admitted on its own, and its id must stay open for
    # the original.
    gate.settle([copy], count=False)
    assert int(redis_client.hget(gate.counters, "settled") or 0) == 2
    assert not gate.rollouts.is_done("r2")
    assert gate.rollouts.pending() == 0


def test_a_finished_run_takes_back_only_the_prompts_no_worker_group_has_read(redis_client: redis.Redis) -> None:
    gate = admission(redis_client, batch_size=2, max_staleness=2, samples_per_prompt=2)
    assert gate.drop_untaken_prompts() == 0  # nothing queued yet
    assert gate.feed(version=0) == 3
    slow = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="slow-workers", consumer="w0")
    fast = StreamQueue(redis_client, PROMPTS, common_pb2.PromptTask, group="fast-workers", consumer="w0")
    slow.ensure_group()
    fast.ensure_group()
    slow.consume(1)
    taken = fast.consume(2)
    assert gate.drop_untaken_prompts() == 1
    # What the furthest group has read stays (its rollouts may still come); the window shrinks by the
    # samples of the prompt taken back.
    assert [t.id for t in queued(redis_client)] == [d.message.id for d in taken]
    assert int(redis_client.hget(gate.counters, "admitted") or 0) == 6 - 2
    assert fast.consume(10) == [] and len(slow.consume(10)) == 1
