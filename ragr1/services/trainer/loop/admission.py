"""Admission control: prompts are queued only while the rollouts they will bring fit the staleness window.

The counters live in Redis, in the hash ``ragr1:trainer:<group>``: ``tasks`` (prompts queued so far, which
numbers the next ones), ``admitted`` (rollouts those prompts will bring) and ``settled`` (admitted rollouts
trained, dropped or skipped). Each moves in the same transaction as the stream write or acknowledgement it
counts, so a trainer that crashes between the two cannot leave them apart.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis

from ragr1.services.common.streams import PROMPTS, Delivery, StreamQueue
from ragr1.services.trainer.config import PPOConfig
from ragr1.v1 import common_pb2

# The loop's parts log under the name the loop had as one module, which log filters select.
log = logging.getLogger(__package__)

# Deletes the prompts no consumer group other than the trainer's own has read (their ids are above
# every other group's last-delivered id) and takes their rollouts out of the admission count, in one
# step, so that a worker cannot take an entry between the check and the delete.
# KEYS: prompts stream, counters hash. ARGV: the trainer's group, rollouts per prompt.
_DROP_UNTAKEN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local last, last_ms, last_seq = '0-0', 0, 0
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  if info['name'] ~= ARGV[1] then
    local ms, seq = parse(info['last-delivered-id'])
    if ms > last_ms or (ms == last_ms and seq > last_seq) then
      last, last_ms, last_seq = info['last-delivered-id'], ms, seq
    end
  end
end
local entries = redis.call('XRANGE', KEYS[1], '(' .. last, '+')
for _, entry in ipairs(entries) do redis.call('XDEL', KEYS[1], entry[1]) end
if #entries > 0 then redis.call('HINCRBY', KEYS[2], 'admitted', -#entries * tonumber(ARGV[2])) end
return #entries
"""


class Admission:
    """Queues prompts (copies of ``tasks``, in turn) up to ``(max_staleness + 1) × batch_size`` admitted
    rollouts in flight, and settles rollouts: acknowledges them and counts them out of the window."""

    def __init__(
        self,
        config: PPOConfig,
        client: redis.Redis,
        prompts: StreamQueue[Any],
        rollouts: StreamQueue[Any],
        tasks: Sequence[common_pb2.PromptTask],
    ) -> None:
        if not tasks:
            raise ValueError("no prompts to train on")
        self.config = config
        self.redis = client
        self.prompts = prompts
        self.rollouts = rollouts
        self.tasks = list(tasks)
        self.counters = f"ragr1:trainer:{config.group}"
        # In every task id this trainer admits: rollout ids derive from task ids and done marks last a week,
        # so another run on the same Redis must not reuse them (its rollouts would be skipped as duplicates).
        self.run_id = uuid.uuid4().hex[:8]

    @property
    def per_task(self) -> int:
        return max(1, self.config.samples_per_prompt)

    def settled(self) -> int:
        """Admitted rollouts no longer in flight: trained, dropped, dead-lettered, or never to come because
        a rollout worker dead-lettered their prompt (each of whose samples was admitted)."""
        settled = int(self.redis.hget(self.counters, "settled") or 0)
        dead_prompts = int(self.redis.xlen(self.prompts.dead_stream)) * self.per_task
        return settled + int(self.redis.xlen(self.rollouts.dead_stream)) + dead_prompts

    def feed(self, version: int) -> int:
        """Admits prompts up to the staleness window, marked as admitted at ``version``; returns how many
        tasks were queued."""
        c = self.config
        per_task = self.per_task
        window = (c.max_staleness + 1) * c.batch_size
        admitted = int(self.redis.hget(self.counters, "admitted") or 0)
        room = window - (admitted - self.settled())
        count = room // per_task
        if count <= 0:
            return 0
        first = int(self.redis.hget(self.counters, "tasks") or 0)
        batch = []
        for n in range(first, first + count):
            template = self.tasks[n % len(self.tasks)]
            task = common_pb2.PromptTask()
            task.CopyFrom(template)
            task.id = f"{template.id}#{self.run_id}-{n}"
            task.group_id = task.id
            task.num_samples = per_task
            task.admitted_at_version = version
            batch.append(task)
        pipe = self.redis.pipeline(transaction=True)
        self.prompts.produce(batch, pipe)
        pipe.hincrby(self.counters, "tasks", count)
        pipe.hincrby(self.counters, "admitted", count * per_task)
        pipe.execute()
        return count

    def settle(self, deliveries: Sequence[Delivery[Any]], count: bool = True) -> None:
        """Acknowledges; ``count=False`` for second copies of buffered rollouts, which were never admitted
        on their own and whose ids must not be marked done before the originals are trained."""
        n = len(deliveries)
        self.rollouts.ack(
            deliveries, also=(lambda pipe: pipe.hincrby(self.counters, "settled", n)) if count else None, done=count
        )

    def drop_untaken_prompts(self) -> int:
        """Deletes the admitted prompts no rollout worker has taken yet; returns how many."""
        script = self.redis.register_script(_DROP_UNTAKEN)
        count = int(script(keys=[PROMPTS, self.counters], args=[self.config.group, self.per_task]))
        if count:
            log.info("training is done: removed %d prompts no rollout worker had taken", count)
        return count
