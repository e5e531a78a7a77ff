"""The PPO loop around the queue: feed prompts, collect rollouts, update, checkpoint, acknowledge, announce.

Guarantees, and how:

- **Bounded staleness.** Prompts are admitted only while fewer than ``(max_staleness + 1) ×
  batch_size`` admitted rollouts are unsettled (settled = trained, dropped or dead-lettered), so a
  rollout is trained at most ``max_staleness`` versions after the version it was admitted at. Whatever
  still arrives staler (a slow replica) is dropped, acknowledged and counted.
- **Nothing trained twice, nothing lost.** A batch is acknowledged only after the checkpoint of the
  update that used it is on disk, and that checkpoint lists every rollout id trained so far. After a
  crash the restarted trainer loads the latest checkpoint, re-reads its pending entries (and takes over
  those pending under another consumer name, when it comes back under a new one), acknowledges the ones
  the checkpoint already lists, and trains the rest. Duplicates by
  rollout id (a producer that retried) are acknowledged without training.
- **Bad rollouts do not stop training.** Length disagreements, versions from the future and greedy
  rollouts (no behaviour distribution) are dead-lettered with the reason by the queue's ``validate`` hook.
- **Whole groups.** With ``samples_per_prompt > 1`` a batch holds only complete groups (the samples of
  one prompt, which GRPO compares with each other): a group still arriving waits, and a group with a
  stale or dead-lettered member is dropped whole.
- **Dynamic sampling** (DAPO's, verl's ``filter_groups``), when ``max_uniform_groups`` > 0: a complete group
  whose members all scored the same total has a group-relative advantage of zero and teaches nothing, so it
  is settled without training and never enters a batch; the loop samples further prompts until a batch of
  groups with a spread is in. The bound is DAPO's too: once an update has skipped ``max_uniform_groups``
  groups it trains the groups with a spread it holds, fewer than a batch if need be (DAPO would raise there;
  on two cores a smaller batch now beats more sampling); with none it stops with ``NoSignal``, which names
  the problem, as DAPO does. So no update trains on groups that cannot teach.
- **Weight-sync check.** For the rollouts sampled at the trainer's own version or one version behind
  (most of a batch when rollouts overlap updates; the updater keeps the weights before its last
  update), the trainer's log-probs under the weights that sampled them must equal the ones vLLM
  recorded; a gap above ``logprob_gap_threshold`` is reported as a probable weight-sync failure (the
  policy serves other weights than the trainer published).
- **Training-health alarms** (``health``): after each update, the likelihood change of the rollouts it
  reinforced, the entropy, the KL and the weight-sync gap are checked against their thresholds; an
  alarm that fires is logged with its name and the update, and counted.
- **Replicas find the weights themselves.** Each version is announced once in Redis after its checkpoint
  is on disk (``publisher``); a replica that starts, restarts or joins loads the newest announced version
  before it takes a prompt, so the trainer needs no list of replicas. A trainer restarted between a save
  and its announcement announces at resume.
- **A fleet that cannot follow stops the trainer.** While collecting, the loop reads the replicas' reports
  every ``fleet_poll_seconds`` (the fleet metrics) and stops with each replica's state when every live
  replica refused the newest version or none has served it for ``weights_timeout_seconds``; otherwise
  the trainer would wait for rollouts that never come. A fleet with no replica stops nothing.
- **A bounded Redis.** After each update the loop deletes the prompts and rollouts that every consumer
  group is done with (``trim_streams``); what is pending or not yet delivered stays, and so do the
  dead letters and the done keys (7 days).
- **An idle policy after a finite run.** Reaching ``max_updates``, the loop deletes the prompts it
  admitted that no rollout worker has taken, so that the workers stop when their current work ends.

The admission counters live in Redis (``ragr1:trainer:<group>``) and move in the same transactions as
the stream writes and acknowledgements they count.

The parts: ``admission`` (prompts queued within the window, rollouts settled, the counters), ``groups``
(the rollouts waiting for a batch: whole groups, drops, dynamic sampling), ``record`` (each update's step
record), ``gauges`` (the record and the alarms as metrics and log lines), and ``ppo_loop``, which composes
them. All of them log as ``ragr1.services.trainer.loop``.
"""

from ragr1.services.trainer.loop.admission import Admission
from ragr1.services.trainer.loop.groups import GroupBuffer, has_spread
from ragr1.services.trainer.loop.ppo_loop import (
    PPOLoop,
    Publisher,
    TrainerStatus,
    Updater,
    check_rollout,
    to_sample,
)
from ragr1.services.trainer.loop.record import (
    CURVES,
    REWARD_PARTS,
    SIGNAL_PARTS,
    lengths,
    signal_share,
    step_record,
)

__all__ = [
    "CURVES",
    "REWARD_PARTS",
    "SIGNAL_PARTS",
    "Admission",
    "GroupBuffer",
    "PPOLoop",
    "Publisher",
    "TrainerStatus",
    "Updater",
    "check_rollout",
    "has_spread",
    "lengths",
    "signal_share",
    "step_record",
    "to_sample",
]

