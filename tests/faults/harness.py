"""`make test-faults`: a real PPO run on the local stack while its processes are killed, paused and restarted;
then every prompt is accounted for from Redis and the trainer's checkpoint, not from the code's counters.

    .venv/bin/python -m tests.faults.harness [--updates 12] [--seed 0] [--run-dir DIR] [--reclaim-ms MS]
        [--sft-questions 24] [--sft-checkpoint DIR]

The rollout workers run with the default ``reclaim_idle_ms`` (10 minutes), as deployed, so that no fault is
hidden by a short reclaim time: only the worker paused past it may lose its prompts to a reclaim, and the run
takes that much longer (about an hour on 2 idle cores, the SFT of its starting weights included).
``--reclaim-ms`` shortens it for a quick look. The
faults come one after another as the trainer reaches their versions, and several last a time of their own (the
worker's pause the reclaim time, the shard's five minutes) whatever the trainer does meanwhile, so how many
updates they span is the machine's speed: the run is not a number of updates fixed in advance. The trainer runs
until stopped (``max_updates`` 0), and once every fault is over and it has trained
``FINAL_UPDATES`` more (and at least ``--updates`` in all) it is stopped as `ragr1 up` stops it on Ctrl-C: SIGTERM,
the update in hand finished, checkpointed and announced; the workers then finish what was admitted.

The stack is `ragr1 up`'s (`ragr1.stack`: Redis with its append-only file, the retriever router and two
shards, the reward service, one policy replica with a rollout worker, the PPO trainer with GRPO and LoRA on
SmolLM2-135M), supervised as `ragr1 up` supervises it: whatever dies is restarted with backoff, and
`ragr1 scale` adds and removes policy replicas. The trainer starts, as a real run does, from an SFT checkpoint
that is not the replicas' own model: `ragr1 train sft` on ``--sft-questions`` questions a source, searched
through the stack's retriever once it is up (or ``--sft-checkpoint``, an earlier run's). It announces them
as v0, and every replica must load them before its first prompt. The SFT model searches, where the base
model hardly does: without searches the retriever's faults would meet no call. A third of the prompts cannot be served
(questions over the policy's length limit), so their workers dead-letter them. Faults, each at a point drawn
from ``--seed`` or chosen by the run's state:

- a second replica joins after the first update (`ragr1 scale --policy-replicas 2`): it must load the
  announced version before it takes a prompt (no rollout of its own below that version), and its
  rollouts reach the trainer;
- the trainer SIGKILLed 5 times, spread over the run (during start-up, collection, an update or a save);
- a rollout worker paused (SIGSTOP) while it holds prompts, past the reclaim time, then resumed: the
  other worker reclaims them and the paused one's late copies (produced twice: the de-duplication must
  run) must not be trained twice;
- the other rollout worker SIGKILLed while it holds prompts (it comes back and must load the announced
  version before it takes a prompt);
- the reward service paused (SIGSTOP) while the workers hold prompts until a Score call fails (its deadline
  passes), then SIGKILLed (the supervisor restarts it): the prompts of the failed call go back at once (parked to
  be handed out again after a backoff, or taken again) and are trained soon after, not after the reclaim time;
- a retriever shard SIGKILLed and restarted: the router, never restarted, answers in full afterwards;
- Redis SIGKILLed and restarted from its append-only file: every client rides it out (no other restart);
- a replica SIGKILLed half-way through loading a version: it comes back and loads the current one;
- a replica's vLLM engine core stopped (SIGSTOP on the engine's processes, not the worker's) while it holds
  prompts: its engine makes no step for ``STALL_S`` (the workers' stall_seconds), so the replica turns
  NOT_SERVING and stops, handing its prompts back (the supervisor restarts it); they run on the other replica
  within the stall limit plus one reclaim;
- the second replica scaled away (`ragr1 scale --policy-replicas 1`: SIGTERM, not restarted) while paused
  mid-rollout (its vLLM engine's processes SIGSTOPped while it holds prompts): it hands them back (its
  consumer leaves the group), the other takes them over, and the run goes on with one replica;
- a retriever shard down (SIGSTOP) for ``SHARD_DOWN_S``, far past a prompt's retry budget: every search in that
  time fails (the router answers UNAVAILABLE), none counts against its prompt, no prompt is dead-lettered, and
  rollouts come again within a minute of the shard's return.

Auth is on, as `ragr1 up --auth` turns it on (a bearer token on every gRPC call, a Redis password): before
the faults, each service is called without the token and with it, and Redis without its password; after
the run, no file of the run folder (logs, step logs, checkpoint metadata) and no process's command line
may hold either secret.

Then, from Redis and the last checkpoint: the trainer stopped past the last fault, exiting cleanly, and trained
four rollouts an update; no rollout id trained twice; trained rollouts come in whole groups; every admitted prompt
is trained, dead-lettered with a reason, still in the queue at the end or dropped by the trainer's staleness bound
-- none is missing; services restarted exactly as often as they were killed; every life of every replica took its
first prompt serving the version announced then, with its digest (the trainer's starting weights included); the
remaining replica serves the last version; no prompt was taken over after the reclaim time but the paused worker's
(every other fault's prompts went back at once); no vLLM process outlives the stack. Writes ``faults.json``
in the run folder and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import redis

from ragr1.errors import ServiceCallError
from ragr1.model_paths import find_model, policy_checkpoint
from ragr1.services.common import fleet
from ragr1.services.common.config import flags
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.streams import HANDED_BACK, PROMPTS, ROLLOUTS
from ragr1.services.policy.client import PolicyClient
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.trainer.checkpoint import Checkpointer
from ragr1.services.trainer.config import SFTConfig
from ragr1.shipped import ROOT
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig
from ragr1.stack.demo import train_sft
from ragr1.stack.index_cache import ensure_index
from ragr1.stack.local import run_dir
from ragr1.stack.questions import Split, split_questions, write_jsonl
from ragr1.stack.scale import Scaler, is_replica, replica_name
from ragr1.stack.supervisor import RestartPolicy, ServiceSpec, Supervisor
from ragr1.v1 import common_pb2
from tests.common.waiting import poll_until

WORKER_GROUP = "rollout-workers"
# The replicas' grace period: short, so that a replica scaled away mid-rollout hands back what it holds.
GRACE_S = 3
TRAINER_GROUP = "trainer"
# The rollout workers' reclaim time unless --reclaim-ms says otherwise: the one they are deployed with.
RECLAIM_MS = next(f.default for f in dataclasses.fields(PolicyConfig) if f.name == "reclaim_idle_ms")
TRAINER_KILLS = 5
# Updates the trainer trains once every fault is over, before it is stopped: the last fault's effects (a
# replica back, rollouts again after the shard's return) trained on, not only seen.
FINAL_UPDATES = 2
# The run's limit, besides twice the reclaim time (the paused worker's fault waits it out).
TIMEOUT_S = 5400
# How long the reward service stays paused at most, waiting for a Score call to fail (its deadline is 60 s; a
# group on a loaded machine can take minutes to reach its Score call).
REWARD_PAUSE_S = 600
# How long after the reward's SIGKILL the workers' scoring failures are still collected (a call in flight fails).
COLLECT_S = 30
# A worker's log line when it hands back prompts after a failed delivery (ragr1/services/policy/worker.py).
RETRIED = re.compile(r"prompts (.+?) handed back after their failed delivery (\d+) \((\w+): ")
# A consumer's log line when it took over entries whose owner stopped renewing its lease (common/streams.py).
# Its time is the log line's (logging's asctime: local time, milliseconds after the comma).
TOOK_OVER = re.compile(r"^(\S+ \S+),(\d+) .*?prompts: (\S+) took over (.+?), idle for (\d+) ms or more", re.M)
# How long past the reclaim time a stopped worker's prompts may wait for the other replica to have room (a
# rollout and an update on two busy cores), and a failed Score call's prompts to be trained again.
TAKE_OVER_S = 120
# The replicas' stall limit (WorkerSettings.stall_seconds): far above a step of the 135M model here.
STALL_S = 60
# How long a shard stays down: the five minutes, past the retry budget of a prompt (5 deliveries).
SHARD_DOWN_S = 300
# The SFT of the trainer's starting weights: enough that the model searches in most rollouts (twelve questions a
# source for two passes left it searching in one of six), little enough to take a few minutes.
SFT_QUESTIONS = 24
SFT_EPOCHS = 5
# Questions the policy refuses (over its max_question_chars of 4096): their prompts are dead-lettered.
UNSERVABLE = "Which of these is the answer? " + "and which of them? " * 260


@dataclasses.dataclass
class Fault:
    name: str
    at_version: int  # not before the trainer has made this many updates
    done: bool = False
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Wall-clock seconds: when it was first acted on, and when it was over (``Chaos.step``).
    began: float | None = None
    ended: float | None = None


# The faults that take a replica out of service, and which: while one is under way, that replica's prompts may
# rightly idle past the reclaim time and be taken over. No other take-over is a fault's.
OUT_OF_SERVICE = {"worker paused past the reclaim time": "policy-1", "worker killed": "policy",
                  "load killed half-way through": "policy-1", "engine stopped": "policy-1",
                  "replica scaled away": "policy-1"}


class Chaos:
    """Injects the faults one by one as the run reaches them; ``step`` is called twice a second."""

    def __init__(self, supervisor: Supervisor, updates: int, seed: int, reclaim_ms: int) -> None:
        self.s = supervisor
        self.rng = random.Random(seed)
        self.updates = updates
        # The version at which the trainer is stopped, set once every fault is over (``_end``).
        self.stop_at: int | None = None
        self.stop_sent = False
        self.reclaim_ms = reclaim_ms
        # The i-th trainer kill comes after update (i-1)//2, a random 5-60 s after the trainer (re)started;
        # the other faults come after them, one at a time (each waits for the one before).
        self.trainer_kills: list[dict[str, Any]] = []
        self.next_kill_after = self.rng.uniform(5, 60)
        self.started_at = time.monotonic()
        self.faults = [
            Fault("replica joined", at_version=1),
            Fault("reward restarted", at_version=2),
            Fault("shard killed", at_version=3),
            Fault("worker paused past the reclaim time", at_version=4),
            Fault("worker killed", at_version=5),
            Fault("redis killed", at_version=6),
            Fault("load killed half-way through", at_version=7),
            Fault("engine stopped", at_version=8),
            Fault("replica scaled away", at_version=9),
            Fault("shard down for five minutes", at_version=10),
        ]
        self._scale: subprocess.Popen[bytes] | None = None
        self._paused_engine: set[int] = set()
        self._paused_at: float | None = None
        self._trainer_pid: int | None = None
        self._killed_pid: int | None = None
        assert supervisor.auth is not None
        self.options = supervisor.auth.channel_options()

    def proc(self, name: str) -> ServiceProcess:
        return self.s.processes[name]

    def version(self) -> int:
        latest = Checkpointer(self.s.run_dir / "trainer" / "checkpoints").latest()
        return int(latest[1]["version"]) if latest else 0

    def pending(self, consumer: str, fresh_ms: int = 0) -> list[str]:
        """The prompts ``consumer`` holds; with ``fresh_ms``, none unless it took every one of them within that
        many milliseconds."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            rows = client.xpending_range(PROMPTS, WORKER_GROUP, "-", "+", 100, consumername=consumer)
        except Exception:  # the group does not exist yet, or Redis is restarting
            return []
        finally:
            client.close()
        if fresh_ms and any(row["time_since_delivered"] > fresh_ms for row in rows):
            return []
        return [row["message_id"].decode() for row in rows]

    def step(self) -> None:
        version = self.version()
        trainer = self.proc("trainer")
        if trainer.process is not None and trainer.process.pid != self._trainer_pid:
            self._trainer_pid = trainer.process.pid
            self.started_at = time.monotonic()
        # One fault at a time, in order, so that each one's effect is its own: no trainer kill while another
        # fault is due or under way (a restarted trainer re-publishes its version, which would hide whether a
        # restarted replica is brought up to date by the running trainer).
        fault = next((f for f in self.faults if not f.done), None)
        busy = fault is not None and (bool(fault.detail) or version >= fault.at_version)
        kills = len(self.trainer_kills)
        # A process SIGKILLed may take seconds to exit on a loaded machine: the next kill waits for its successor.
        if (not busy and kills < TRAINER_KILLS and version >= kills // 2 and trainer.alive()
                and self._trainer_pid != self._killed_pid
                and time.monotonic() - self.started_at > self.next_kill_after):
            self._killed_pid = self._trainer_pid
            trainer.signal(signal.SIGKILL)
            self.trainer_kills.append({"at_version": version, "seconds_after_start": round(self.next_kill_after, 1)})
            print(f"chaos: trainer SIGKILLed ({kills + 1} of {TRAINER_KILLS}) at version {version}, "
                  f"{self.next_kill_after:.0f} s after it started", flush=True)
            self.next_kill_after = self.rng.uniform(5, 60)
            return
        if fault is None and kills == TRAINER_KILLS:
            self._end(version, trainer)
            return
        # A fault starts once the trainer is past its start-up (it must ride the fault out, not restart).
        settled = trainer.alive() and time.monotonic() - self.started_at > 30
        if fault is not None and version >= fault.at_version and (busy or settled):
            getattr(self, "_" + fault.name.split()[0])(fault)
            if fault.began is None and fault.detail:
                fault.began = time.time()
            if fault.done:
                fault.ended = time.time()

    def _end(self, version: int, trainer: ServiceProcess) -> None:
        """Every fault over: FINAL_UPDATES more updates (at least ``updates`` in all), then SIGTERM to the
        trainer, which finishes the update in hand and exits; the run's loop sees it exit cleanly."""
        if self.stop_at is None:
            self.stop_at = max(self.updates, version + FINAL_UPDATES)
            print(f"chaos: every fault over at version {version}; the trainer stops at version {self.stop_at}",
                  flush=True)
        if not self.stop_sent and version >= self.stop_at and trainer.alive():
            trainer.signal(signal.SIGTERM)
            self.stop_sent = True
            print(f"chaos: trainer SIGTERMed at version {version}", flush=True)

    def _reward(self, fault: Fault) -> None:
        """The reward service paused while the workers hold prompts, until a worker says a Score call failed and
        handed its prompts back (or REWARD_PAUSE_S passed), then SIGKILLed and restarted by the supervisor (a call
        in flight then fails too). Every scoring failure the workers log from the pause until COLLECT_S after the
        kill is recorded with where its prompts were when it was logged; done once each of those prompts is
        trained again (acknowledged by a worker), or TAKE_OVER_S past the reclaim time (the audit then asks the last
        checkpoint whether they were trained by the run's end: trainer kills may follow). That they went back at once,
        not after the reclaim time, is where each was when its failure was logged (``went_back``); how soon they
        are trained again is a restart, a rollout and an update, whatever the reclaim time."""
        reward = self.proc("reward")
        logs = sorted(self.s.log_dir.glob("policy*.log"))
        if not fault.detail:
            if not reward.alive() or not (self.pending("policy") or self.pending("policy-1")):
                return
            reward.signal(signal.SIGSTOP)
            fault.detail.update(paused_at=time.monotonic(), offsets={str(p): p.stat().st_size for p in logs},
                                failed_delivery={}, state_when_said={})
            print("chaos: reward SIGSTOPped while the workers hold prompts", flush=True)
            return
        if "offsets" in fault.detail:
            self._score_failures(fault, logs)
            now = time.monotonic()
            if "killed_at" not in fault.detail:
                paused = now - fault.detail["paused_at"]
                if not fault.detail["failed_delivery"] and paused < REWARD_PAUSE_S:
                    return
                reward.signal(signal.SIGKILL)
                fault.detail.update(paused_s=round(paused, 1), killed_at=now)
                print(f"chaos: reward SIGKILLed after {paused:.0f} s paused; Score calls failed so far for "
                      f"{sorted(fault.detail['failed_delivery'])}", flush=True)
                return
            if now - fault.detail["killed_at"] < COLLECT_S:
                return
            fault.detail.pop("offsets")
            fault.detail.update(score_failed=bool(fault.detail["failed_delivery"]),
                                failed=sorted(fault.detail["failed_delivery"]))
        done = [task for task in fault.detail["failed"] if self.done(task)]
        waited = time.monotonic() - fault.detail["killed_at"]
        if len(done) < len(fault.detail["failed"]) and waited < self.reclaim_ms / 1000 + TAKE_OVER_S:
            return
        fault.detail.update(trained_again=len(done), trained_again_within_s=round(waited, 1),
                            reward_back=reward.alive())
        fault.detail.pop("killed_at")
        fault.done = True
        print(f"chaos: {len(done)} of {len(fault.detail['failed'])} prompts of the failed Score calls "
              f"({fault.detail['state_when_said']}) trained again within {waited:.0f} s of the reward's restart (the "
              f"reclaim time: {self.reclaim_ms / 1000:.0f} s)", flush=True)

    def _score_failures(self, fault: Fault, logs: list[Path]) -> None:
        """Records each prompt a worker says it handed back after a failed Score call since the pause, with where it
        is the moment that is read: parked to be handed out again (or taken again already, its failed delivery
        counted), not held by the worker that failed."""
        for log in logs:
            text = log.read_text(errors="replace")[fault.detail["offsets"].get(str(log), 0):]
            for m in RETRIED.finditer(text):
                for task in m[1].split(", "):
                    if m[3] == "scoring" and task not in fault.detail["failed_delivery"]:
                        fault.detail["failed_delivery"][task] = int(m[2])
                        fault.detail["state_when_said"][task] = self.prompt_state(task)
                        print(f"chaos: a Score call failed; prompt {task} (delivery {m[2]}): "
                              f"{fault.detail['state_when_said'][task]}", flush=True)

    def prompt_state(self, task: str) -> str:
        """Where the prompt ``task`` is: parked (handed back), held by a worker on a later delivery, held on its
        first (never handed back), acknowledged, or unknown."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            entry = next((e for e, f in client.xrange(PROMPTS) if f.get(b"id") == task.encode()), None)
            if entry is None:
                return "unknown"
            rows = client.xpending_range(PROMPTS, WORKER_GROUP, entry, entry, 1)
        finally:
            client.close()
        if not rows:
            return "acknowledged"
        owner, times = rows[0]["consumer"].decode(), int(rows[0]["times_delivered"])
        if owner == HANDED_BACK:
            return "handed back"
        return f"held by {owner} on delivery {times}"

    def done(self, task: str) -> bool:
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return bool(client.exists(f"ragr1:done:{PROMPTS}:{WORKER_GROUP}:{task}"))
        finally:
            client.close()

    def _shard(self, fault: Fault) -> None:
        if fault.name.startswith("shard down"):
            self._shard_down(fault)
            return
        shard = self.proc("retriever-shard-1")
        if not fault.detail:
            shard.signal(signal.SIGKILL)
            fault.detail["killed_at"] = time.monotonic()
            print("chaos: retriever-shard-1 SIGKILLed", flush=True)
            return
        if not shard.alive() or time.monotonic() - fault.detail["killed_at"] < 5:
            return
        router = RetrieverClient(next(spec.target for spec in self.s.specs if spec.name == "retriever"),
                                 self.options)
        try:
            ready = router.shards_ready(timeout=5)
            if not all(ready):
                return
            reply = router.search(["Who wrote the novel Moby-Dick?"], top_k=5, timeout=10)
        except Exception:
            return
        finally:
            router.close()
        fault.detail.update(back_after_s=round(time.monotonic() - fault.detail.pop("killed_at"), 1),
                            partial=reply.partial, hits=len(reply.results[0].passages))
        fault.done = True
        print(f"chaos: shard back, router answers in full: {not reply.partial}", flush=True)

    def dead_letters(self) -> list[str]:
        """The reasons of every prompt dead-lettered so far."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return [f.get(b"reason", b"").decode() for _, f in client.xrange(PROMPTS + ":dead")]
        finally:
            client.close()

    def tasks_of(self, entry_ids: list[str]) -> list[str]:
        """The prompt (task) ids of the prompts stream's entries ``entry_ids``."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return [fields[b"id"].decode() for e in entry_ids for _, fields in client.xrange(PROMPTS, e, e)]
        finally:
            client.close()

    def produced_twice(self, task_ids: list[str], since_ms: int) -> int:
        """How many rollouts of the prompts ``task_ids`` the rollouts stream holds more than once among its entries
        since ``since_ms`` (Redis's clock, this machine's): prompts held unacknowledged then had produced none."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            ids = Counter(fields[b"id"].decode() for _, fields in client.xrange(ROLLOUTS, min=f"{since_ms}-0"))
        finally:
            client.close()
        return sum(1 for rollout_id, n in ids.items() if n > 1 and rollout_id.rsplit("/", 1)[0] in task_ids)

    def rollouts_produced(self) -> int:
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return int(client.xlen(ROLLOUTS))
        finally:
            client.close()

    def _engine(self, fault: Fault) -> None:
        """policy-1's vLLM engine processes SIGSTOPped while it holds prompts it took a moment ago (its worker runs
        on): done once every prompt it held is trained or held by the other replica, and policy-1 is back (restarted
        by the supervisor) serving the trainer's current version."""
        worker = self.proc("policy-1")
        if not fault.detail:
            held = self.pending("policy-1", fresh_ms=2000)
            if not held or not worker.alive() or worker.process is None:
                return
            engine = engine_processes() & descendants(worker.process.pid)
            if not engine:
                return
            for pid in engine:
                os.kill(pid, signal.SIGSTOP)
            fault.detail.update(held=held, stopped_at=time.monotonic(), engine_stopped=len(engine),
                                restarts=self.s.endpoints()["services"]["policy-1"]["restarts"],
                                log_offset=worker.log_path.stat().st_size)
            self._paused_engine = engine
            print(f"chaos: policy-1's engine ({len(engine)} processes) SIGSTOPped holding {len(held)} prompts",
                  flush=True)
            return
        if "taken_over_s" not in fault.detail:
            elsewhere = set(self.pending("policy"))
            waited = time.monotonic() - fault.detail["stopped_at"]
            if (not all(self.done_entry(e) or e in elsewhere for e in fault.detail["held"])
                    and waited < STALL_S + self.reclaim_ms / 1000 + 120):
                return
            fault.detail["taken_over_s"] = round(time.monotonic() - fault.detail["stopped_at"], 1)
            fault.detail["ran_elsewhere"] = sum(self.done_entry(e) or e in elsewhere for e in fault.detail["held"])
            text = worker.log_path.read_text(errors="replace")[fault.detail["log_offset"]:]
            fault.detail["stall_said"] = "no step for" in text
            said = re.search(r"(\d+) unfinished prompts handed back", text)
            fault.detail["handed_back_said"] = int(said[1]) if said else None
            for pid in self._paused_engine:  # a process its replica did not take down with it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            print(f"chaos: policy-1's prompts ran elsewhere {fault.detail['taken_over_s']} s after its engine "
                  "stopped", flush=True)
        restarted = self.s.endpoints()["services"]["policy-1"]["restarts"] > fault.detail["restarts"]
        if not restarted or not worker.alive():
            return
        fault.detail.setdefault("killed_at", fault.detail["stopped_at"])
        fault.detail.setdefault("trainer_pid", self._trainer_pid)
        self._caught_up(fault, "policy-1")

    def done_entry(self, entry_id: str) -> bool:
        """Whether the prompts entry ``entry_id`` was acknowledged (no longer pending, not in the dead letters)."""
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return not client.xpending_range(PROMPTS, WORKER_GROUP, entry_id, entry_id, 1)
        finally:
            client.close()

    def _shard_down(self, fault: Fault) -> None:
        """retriever-shard-0 SIGSTOPped for SHARD_DOWN_S, then SIGCONT; done once a rollout is produced after its
        return (or a minute passed), with the prompts dead-lettered meanwhile counted."""
        shard = self.proc("retriever-shard-0")
        if not fault.detail:
            if not shard.alive():
                return
            shard.signal(signal.SIGSTOP)
            fault.detail.update(stopped_at=time.monotonic(), dead_before=len(self.dead_letters()),
                                at_version=self.version(),
                                log_offsets={str(p): p.stat().st_size for p in self.s.log_dir.glob("policy*.log")})
            print(f"chaos: retriever-shard-0 SIGSTOPped for {SHARD_DOWN_S} s", flush=True)
            return
        now = time.monotonic()
        if "back_at" not in fault.detail:
            if now - fault.detail["stopped_at"] < SHARD_DOWN_S:
                return
            shard.signal(signal.SIGCONT)
            fault.detail.update(back_at=now, down_s=round(now - fault.detail["stopped_at"], 1),
                                rollouts_at_return=self.rollouts_produced(), version_at_return=self.version())
            print("chaos: retriever-shard-0 back", flush=True)
            return
        produced = self.rollouts_produced() > fault.detail["rollouts_at_return"]
        if not produced and now - fault.detail["back_at"] < 90:
            return
        reasons = self.dead_letters()[fault.detail.pop("dead_before"):]
        # The fault happened only if a search met the shard down: a worker says the retriever is down.
        said = [log.read_text(errors="replace")[offset:] for log, offset in
                ((Path(p), o) for p, o in fault.detail.pop("log_offsets").items())]
        fault.detail["retriever_down_said"] = sum(text.count("the retriever is down") for text in said)
        fault.detail.update(rollouts_again=produced, rollouts_again_after_s=round(now - fault.detail.pop("back_at"), 1),
                            dead_lettered_meanwhile=[r for r in reasons if "invalid task" not in r])
        fault.detail.pop("stopped_at")
        fault.done = True
        print(f"chaos: rollouts again {fault.detail['rollouts_again_after_s']} s after the shard's return; "
              f"dead-lettered meanwhile: {fault.detail['dead_lettered_meanwhile']}", flush=True)

    def announced(self) -> int:
        assert self.s.redis is not None
        client = self.s.redis.client()
        try:
            latest = fleet.latest(client)
        finally:
            client.close()
        return latest.version if latest else 0

    def _ask_scale(self, replicas: int) -> None:
        """`ragr1 scale` as a user runs it, beside the stack; the loop's ``Scaler`` does what it asks."""
        self._scale = subprocess.Popen(
            [sys.executable, "-m", "ragr1", "scale", "--run-dir", str(self.s.run_dir), "--policy-replicas",
             str(replicas)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        print(f"chaos: ragr1 scale --policy-replicas {replicas}", flush=True)

    def _scaled(self, fault: Fault) -> bool:
        """Whether the `ragr1 scale` asked for returned (its exit code and output recorded)."""
        assert self._scale is not None
        if self._scale.poll() is None:
            return False
        out = self._scale.stdout.read().decode(errors="replace") if self._scale.stdout else ""
        fault.detail.update(scale_exit=self._scale.returncode, scale_output=out.strip()[-500:],
                            scale_s=round(time.monotonic() - fault.detail.pop("asked_at"), 1))
        self._scale = None
        return True

    def _replica(self, fault: Fault) -> None:
        if fault.name == "replica joined":
            self._join(fault)
        else:
            self._scale_away(fault)

    def _join(self, fault: Fault) -> None:
        """Done once `ragr1 scale --policy-replicas 2` returned: policy-1 serving (the version it serves is
        read back in the audit, from its rollouts)."""
        if not fault.detail:
            fault.detail.update(announced_at_join=self.announced(), asked_at=time.monotonic())
            self._ask_scale(2)
            return
        if self._scaled(fault):
            fault.done = True
            print(f"chaos: policy-1 joined (ragr1 scale exit {fault.detail['scale_exit']}, "
                  f"{fault.detail['scale_s']} s)", flush=True)

    def _scale_away(self, fault: Fault) -> None:
        """policy-1 scaled away while paused mid-rollout (its vLLM engine's processes SIGSTOPped while it holds
        prompts, so that its batch cannot finish within its grace time whatever the machine's speed); done once
        what it handed back is taken over by the other (acknowledged, or pending under it)."""
        if not fault.detail:
            worker = self.proc("policy-1")
            # Prompts it took a moment ago: the other replica reclaims those idle for the reclaim time, which a batch
            # on this machine can outlast, and the scale-down must find them still its own.
            held = self.pending("policy-1", fresh_ms=2000)
            if not held or not worker.alive() or worker.process is None:
                return
            engine = engine_processes() & descendants(worker.process.pid)
            for pid in engine:
                os.kill(pid, signal.SIGSTOP)
            restarts = self.s.endpoints()["services"]["policy-1"]["restarts"]
            fault.detail.update(held=held, restarts=restarts, asked_at=time.monotonic(), engine_paused=len(engine),
                                log_offset=worker.log_path.stat().st_size)
            self._paused_engine = engine
            self._ask_scale(1)
            print(f"chaos: policy-1 scaled away holding {len(held)} prompts, its engine's {len(engine)} processes "
                  "paused", flush=True)
            return
        if self._scale is not None:
            if not self._scaled(fault):
                return
            for pid in self._paused_engine:  # whatever of them is left, so that it can exit
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            # Where what it held went: the other replica takes handed-back prompts within a second when idle, so
            # by now they are often its own already.
            fault.detail.update(left=len(self.pending("policy-1")), waiting_handed_back=len(
                                    set(self.pending(HANDED_BACK)) & set(fault.detail["held"])),
                                taken_by_policy=len(set(self.pending("policy")) & set(fault.detail["held"])),
                                consumer_left="policy-1" not in self.consumers(),
                                stopped_at=time.monotonic(), in_stack="policy-1" in self.s.processes)
            text = self.s.log_dir.joinpath("policy-1.log").read_text(errors="replace")[fault.detail.pop("log_offset"):]
            said = re.search(r"(\d+) unfinished prompts handed back", text)
            fault.detail["handed_back_said"] = int(said[1]) if said else None
        waiting = set(self.pending(HANDED_BACK)) | set(self.pending("policy-1"))
        left = [e for e in fault.detail["held"] if e in waiting]
        if left and time.monotonic() - fault.detail["stopped_at"] < self.reclaim_ms / 1000 + 120:
            return
        fault.detail.update(left_after_reclaim=len(left),
                            taken_over_s=round(time.monotonic() - fault.detail.pop("stopped_at"), 1))
        fault.done = True
        print(f"chaos: policy-1 gone; it handed back {fault.detail['handed_back_said']} prompts (it held "
              f"{len(fault.detail['held'])} when asked to go), {len(left)} not yet taken over", flush=True)

    def consumers(self) -> set[str]:
        assert self.s.redis is not None
        client: Any = self.s.redis.client()
        try:
            return {c["name"].decode() for c in client.xinfo_consumers(PROMPTS, WORKER_GROUP)}
        finally:
            client.close()

    def _worker(self, fault: Fault) -> None:
        if fault.name.startswith("worker paused"):
            self._pause(fault)
        else:
            self._kill_worker(fault)

    def _pause(self, fault: Fault) -> None:
        worker = self.proc("policy-1")
        if self._paused_at is None:
            held = self.pending("policy-1")
            if not held or not worker.alive():
                return
            worker.signal(signal.SIGSTOP)
            self._paused_at = time.monotonic()
            fault.detail["held"] = held
            fault.detail["held_tasks"] = self.tasks_of(held)
            fault.detail["paused_ms"] = int(time.time() * 1000)
            print(f"chaos: policy-1 SIGSTOPped holding {len(held)} prompts", flush=True)
            return
        if "paused_s" in fault.detail:
            # Resumed: the fault ends once both copies of a held prompt are produced (the taker's and the
            # paused worker's late one), so that the next fault (a worker killed) does not kill the taker
            # first; or TAKE_OVER_S after the resume.
            fault.detail["produced_twice"] = self.produced_twice(fault.detail["held_tasks"], fault.detail["paused_ms"])
            resumed = time.monotonic() - self._paused_at - fault.detail["paused_s"]
            if not fault.detail["produced_twice"] and resumed < TAKE_OVER_S:
                return
            fault.done = True
            print(f"chaos: {fault.detail['produced_twice']} rollouts of the paused worker's prompts produced twice, "
                  f"{resumed:.1f} s after its resume", flush=True)
            return
        paused = time.monotonic() - self._paused_at
        if paused < self.reclaim_ms / 1000:
            return
        # A stopped worker acknowledges nothing: what it no longer holds, the other one took over. The other
        # replica reclaims only when it has room, which a rollout of its own can take a while to leave: the pause
        # lasts until every held prompt is taken over, or TAKE_OVER_S past the reclaim time.
        still = set(self.pending("policy-1"))
        fault.detail["taken_over"] = sum(e not in still for e in fault.detail["held"])
        if fault.detail["taken_over"] < len(fault.detail["held"]) and paused < self.reclaim_ms / 1000 + TAKE_OVER_S:
            return
        worker.signal(signal.SIGCONT)
        fault.detail["paused_s"] = round(time.monotonic() - self._paused_at, 1)
        print(f"chaos: policy-1 resumed after {fault.detail['paused_s']} s", flush=True)

    def _kill_worker(self, fault: Fault) -> None:
        """Killed while it holds prompts; done once the restarted replica serves the running trainer's current
        version (which it finds announced in Redis)."""
        worker = self.proc("policy")
        if not fault.detail:
            held = self.pending("policy")
            if not held or not worker.alive():
                return
            worker.signal(signal.SIGKILL)
            fault.detail.update(held=held, killed_at=time.monotonic(), trainer_pid=self._trainer_pid)
            print(f"chaos: policy SIGKILLed holding {len(held)} prompts", flush=True)
            return
        self._caught_up(fault, "policy")

    def _caught_up(self, fault: Fault, name: str) -> None:
        """Done once the restarted replica ``name`` (back at version 0) serves the trainer's current version."""
        target = next(spec.target for spec in self.s.specs if spec.name == name)
        try:
            with PolicyClient(target, self.options) as client:
                served = client.weight_version(timeout=5).version
        except ServiceCallError:
            return  # still starting
        if served < self.version():
            return
        fault.detail.update(caught_up_after_s=round(time.monotonic() - fault.detail.pop("killed_at"), 1),
                            serves=served, same_trainer=fault.detail.pop("trainer_pid") == self._trainer_pid)
        fault.done = True
        print(f"chaos: {name} back and serving v{served}", flush=True)

    def _load(self, fault: Fault) -> None:
        """policy-1 SIGKILLed while it loads an announced version (after its "weights vN: loading" log line,
        before "serving"); done once the restarted replica (back at version 0) serves the trainer's current
        version (the trainer runs on until every fault is over)."""
        worker = self.proc("policy-1")
        if not fault.detail:
            if not worker.alive():
                return
            # A load of the 135M model is over in moments: watch the log closely for up to 30 s.
            log = worker.log_path
            offset = log.stat().st_size

            def loading() -> re.Match[str] | None:  # a load begun and not yet over
                text = log.read_text(errors="replace")[offset:]
                found = re.search(r"weights v(\d+): loading", text)
                if found and f"weights v{found[1]}: serving" not in text:
                    return found
                return None

            began = poll_until(loading, 30, 0.01)
            if began is not None:
                worker.signal(signal.SIGKILL)
                fault.detail.update(version=int(began[1]), killed_at=time.monotonic(),
                                    trainer_pid=self._trainer_pid, offset=offset)
                print(f"chaos: policy-1 SIGKILLed while loading v{began[1]}", flush=True)
            return
        if "killed_mid_load" not in fault.detail:
            # The log of the killed process, up to its restart: the load it began never finished.
            text = worker.log_path.read_text(errors="replace")[fault.detail.pop("offset"):]
            before_restart = text.split("READY policy ", 1)[0]
            fault.detail["killed_mid_load"] = f"weights v{fault.detail['version']}: serving" not in before_restart
        self._caught_up(fault, "policy-1")

    def _redis(self, fault: Fault) -> None:
        """Killed while the trainer runs; done once the same trainer process has trained another update."""
        assert self.s.redis is not None
        if not fault.detail:
            assert self.s.redis.process is not None
            fault.detail.update(trainer_pid=self._trainer_pid, at_version=self.version(), killed_at=time.monotonic())
            self.s.redis.process.send_signal(signal.SIGKILL)
            self.s.redis.process.wait()
            print("chaos: redis SIGKILLed", flush=True)
            return
        if self._trainer_pid != fault.detail["trainer_pid"]:
            fault.detail["same_trainer"] = False
        elif self.version() <= fault.detail["at_version"]:
            return
        fault.detail.setdefault("same_trainer", True)
        fault.detail.update(next_update_after_s=round(time.monotonic() - fault.detail.pop("killed_at"), 1))
        fault.done = True
        print(f"chaos: the trainer trained on after the Redis restart: {fault.detail['same_trainer']}", flush=True)


def prompts_file(directory: Path, split: Split) -> tuple[Path, int]:
    """RL questions with every third replaced by one the policy refuses; returns the file and how many
    templates it has."""
    records = []
    for i, record in enumerate(split.rl):
        records.append(record)
        if i % 2 == 1:
            records.append({**record, "question": f"{UNSERVABLE} ({i})"})
    return write_jsonl(records, directory / "data" / "rl.jsonl"), len(records)


def questions(sft_questions: int) -> Split:
    """The SFT questions (HotpotQA's and PopQA's first), then the RL questions after them."""
    return split_questions(0, sft_questions, sources=("hotpotqa", "popqa"), rl_per_source=4,
                           rl_sources=("popqa", "hotpotqa"))


def build(config: StackConfig, directory: Path, split: Split, reclaim_ms: int) -> tuple[Supervisor, Scaler, Path]:
    """The stack but its trainer (which starts from the SFT weights trained through it), and the policy's model."""
    ports = wiring.Ports.of(config)
    model = policy_checkpoint(config.model)
    index = ensure_index(0, config.num_shards, config.index_type, config.max_passage_tokens, ids=split.passage_ids())
    worker = {"reclaim_idle_ms": reclaim_ms, "worker_batch": 2, "max_in_flight": 2, "grace_seconds": GRACE_S,
              "stall_seconds": STALL_S}

    def replica(i: int) -> ServiceSpec:
        return wiring.policy_spec(config, ports, model, worker, name=replica_name(i), port=ports.replica(i))

    specs = [*wiring.retrieval_specs(config, ports, index), wiring.reward_spec(config, ports), replica(0)]
    supervisor = Supervisor(directory, specs, ports.redis, auth=True)
    return supervisor, Scaler(supervisor, replica), model


def sft(supervisor: Supervisor, config: StackConfig, model: Path, split: Split, epochs: int) -> Path:
    """``ragr1 train sft`` on the split's SFT questions in both search modes, searched through the running stack's
    router (with its token) with the stack's turns and block budget, as the demo's SFT stage; returns the
    checkpoint."""
    directory = supervisor.run_dir
    assert supervisor.auth is not None
    out = directory / "sft"
    settings = {"model": str(model), "train_files": [str(write_jsonl(split.train, directory / "data" / "sft.jsonl"))],
                "limit": 0, "modes": ["single", "multi"], "epochs": epochs, "tokens_per_query": config.tokens_per_query,
                "max_turns": config.max_turns, "output_dir": str(out),
                "retriever_address": f"{wiring.HOST}:{wiring.Ports.of(config).router}"}
    log = directory / "logs" / "sft.log"
    print(f"SFT on {len(split.train)} questions; log {log}", flush=True)
    return train_sft(["train", "sft", *flags(SFTConfig, settings)], out, log, supervisor.auth.env())


def trainer_spec(config: StackConfig, directory: Path, start: Path, prompts: Path) -> ServiceSpec:
    return wiring.trainer_spec(
        config, wiring.Ports.of(config), start, directory / "trainer",
        # Until stopped (the harness stops it), so no warm-up: that is a share of max_updates.
        {"prompts_file": str(prompts), "mode": "multi", "max_updates": 0, "actor_warmup_ratio": 0.0,
         "critic_warmup_ratio": 0.0, "batch_size": 4,
         "samples_per_prompt": 2, "advantage": "grpo", "lora_rank": 16, "actor_lr": 1e-4,
         "mini_batch_size": 4, "micro_batch_size": 2,
         # The audit reads every entry the run produced; trimming (tests/trainer/test_loop.py) would delete them.
         "trim_streams": False},
    )


def waiting(client: Any, stream: str, group: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of ``stream`` the group has not finished: delivered and unacknowledged, or never delivered."""
    pending = {row["message_id"] for row in client.xpending_range(stream, group, "-", "+", 100_000)}
    last = next(g["last-delivered-id"] for g in client.xinfo_groups(stream) if g["name"].decode() == group)
    return [(e, f) for e, f in client.xrange(stream) if e in pending] + client.xrange(stream, min=b"(" + last)


def served_version(policy: PolicyClient, last: int) -> int:
    """The version a replica serves: the last one, ``last``, once it has loaded it (it loads the last version
    the trainer announced after the trainer exited: given 300 s), else what it serves by then."""
    versions: list[int] = []
    poll_until(lambda: versions[-1] >= last, 300, 1.0,
               step=lambda: versions.append(int(policy.weight_version(timeout=10).version)))
    return versions[-1]


def drained(supervisor: Supervisor, limit_s: float = 300) -> bool:
    """Waits until the workers have finished every prompt admitted before the trainer stopped (none delivered
    and unacknowledged, none undelivered), so that the audit reads Redis at rest; False if ``limit_s`` passed."""
    assert supervisor.redis is not None
    client: Any = supervisor.redis.client()
    try:
        return poll_until(lambda: not waiting(client, PROMPTS, WORKER_GROUP), limit_s, 1.0) is not None
    finally:
        client.close()


def audit(supervisor: Supervisor, templates: int, chaos: Chaos) -> dict[str, Any]:
    """What happened to every admitted prompt, from Redis and the last checkpoint; and the replicas' versions."""
    latest = Checkpointer(supervisor.run_dir / "trainer" / "checkpoints").latest()
    assert latest is not None, "the trainer wrote no checkpoint"
    last = int(latest[1]["version"])
    served = {}
    for spec in supervisor.specs:
        if is_replica(spec.name):
            with PolicyClient(spec.target, chaos.options) as policy:
                served[spec.name] = served_version(policy, last)
    assert supervisor.redis is not None
    client: Any = supervisor.redis.client()  # redis-py's replies are typed loosely; used as documented
    trained: list[str] = list(latest[1]["trained_ids"])
    tasks = int(client.hget(f"ragr1:trainer:{TRAINER_GROUP}", "tasks") or 0)

    def number(task_id: str) -> int:
        return int(task_id.rsplit("-", 1)[1])

    def task_of(rollout_id: str) -> str:
        return rollout_id.rsplit("/", 1)[0]

    fate: dict[int, set[str]] = {n: set() for n in range(tasks)}
    by_task = Counter(task_of(r) for r in trained)
    for task in by_task:
        fate[number(task)].add("trained")
    reasons: Counter[str] = Counter()
    for _, fields in client.xrange(PROMPTS + ":dead"):
        fate[number(fields[b"id"].decode())].add("prompt dead-lettered")
        reasons[re.sub(r"\d+", "N", fields[b"reason"].decode())[:80]] += 1
    for _, fields in client.xrange(ROLLOUTS + ":dead"):
        fate[number(task_of(fields[b"id"].decode()))].add("rollout dead-lettered")
    for _, fields in waiting(client, PROMPTS, WORKER_GROUP):
        fate[number(fields[b"id"].decode())].add("prompt still queued")
    queued = {entry_id for entry_id, _ in waiting(client, ROLLOUTS, TRAINER_GROUP)}
    produced: Counter[str] = Counter()
    # Per replica, the policy version of each rollout it produced, in stream order; and who made each id.
    versions: dict[str, list[int]] = {}
    producer_of: dict[str, str] = {}
    for entry_id, fields in client.xrange(ROLLOUTS):
        rollout_id = fields[b"id"].decode()
        produced[rollout_id] += 1
        producer = fields.get(b"producer", b"?").decode()
        versions.setdefault(producer, []).append(common_pb2.Rollout.FromString(fields[b"data"]).policy_version)
        producer_of[rollout_id] = producer
        if task_of(rollout_id) in by_task:
            continue
        if entry_id in queued:
            fate[number(task_of(rollout_id))].add("rollout still queued")
        elif client.exists(f"ragr1:done:{ROLLOUTS}:{TRAINER_GROUP}:{rollout_id}"):
            fate[number(task_of(rollout_id))].add("rollout settled untrained")  # stale, or a group dropped
        else:
            fate[number(task_of(rollout_id))].add("rollout LOST (acknowledged, neither trained nor marked)")
    announcements = [fleet.Announcement.read(*entry) for entry in client.xrange(fleet.WEIGHTS)]
    firsts = first_prompts(supervisor, announcements)
    log = (supervisor.log_dir / "trainer.log").read_text(errors="replace")
    stale = sum(int(n) for n in re.findall(r"dropped (\d+) rollouts \(stale groups\)", log))
    missing = sorted(n for n, f in fate.items() if not f)
    client.close()
    outcome = Counter(" + ".join(sorted(f)) or "no trace" for f in fate.values())
    restarts = {name: info["restarts"] for name, info in supervisor.endpoints()["services"].items()}
    restarts["redis"] = supervisor.endpoints()["redis_restarts"]
    expected_restarts = {name: 0 for name in restarts} | {
        "trainer": len(chaos.trainer_kills), "policy": 1, "retriever-shard-1": 1, "redis": 1, "reward": 1}
    fault = {f.name: f.detail for f in chaos.faults}
    joined, away, reward = fault["replica joined"], fault["replica scaled away"], fault["reward restarted"]
    engine, shard_down = fault["engine stopped"], fault["shard down for five minutes"]
    takeovers = took_over(supervisor)
    trained_by = Counter(producer_of.get(r, "?") for r in trained)
    checks = {
        "the trainer stopped where asked, past every fault (SIGTERM at its version, the update in hand finished)":
            chaos.stop_sent and chaos.stop_at is not None and last >= chaos.stop_at,
        "no rollout id trained twice": len(trained) == len(set(trained)),
        f"four rollouts trained an update ({last * 4} in {last} updates)": len(trained) == last * 4,
        "trained rollouts come in whole groups of 2": all(c == 2 for c in by_task.values()),
        "no rollout lost": not any("LOST" in " ".join(f) for f in fate.values()),
        "no prompt trained and dead-lettered": not any({"trained", "prompt dead-lettered"} <= f for f in fate.values()),
        "the unservable third dead-lettered, with the reason": all(
            ("prompt dead-lettered" in fate[n]) == (n % templates % 3 == 2) for n in fate
            if "prompt still queued" not in fate[n] and n not in missing),
        "every other prompt accounted for": not missing,
        "each service restarted exactly as often as it was killed": restarts == expected_restarts,
        "every fault injected": all(f.done for f in chaos.faults) and len(chaos.trainer_kills) == TRAINER_KILLS,
        "the router answered in full once the shard was back": fault["shard killed"].get("partial") is False,
        "the paused worker's prompts were taken over by the other": fault["worker paused past the reclaim time"].get(
            "taken_over") == len(fault["worker paused past the reclaim time"].get("held", [None])),
        "the killed worker, back at v0, loaded the running trainer's current version":
            fault["worker killed"].get("same_trainer") is True,
        "the remaining replica serves the last version": served == {"policy": last},
        "policy-1 joined (ragr1 scale returned 0)": joined.get("scale_exit") == 0,
        "policy-1 loaded the announced version before its first prompt (no rollout of its below it)":
            min(versions.get("policy-1", [-1])) >= joined.get("announced_at_join", 1) >= 1,
        # One per life: policy started, killed and restarted (2), policy-1 joined, killed mid-load and restarted (2).
        "every life of every replica took its first prompt serving the version then announced, by digest":
            len(firsts) >= 4 and all(f["ok"] for f in firsts),
        "a replica's first prompts met the trainer's starting weights, not its own model":
            any(f["version"] == 0 and f["ok"] for f in firsts),
        "duplicates were produced (the paused worker's late copies) and none trained twice":
            fault["worker paused past the reclaim time"].get("produced_twice", 0) > 0
            and len(trained) == len(set(trained)),
        "rollouts of both replicas were trained": trained_by["policy"] > 0 and trained_by["policy-1"] > 0,
        "each replica's rollout versions never go back (one version per rollout, newer weights after a restart)":
            all(v == sorted(v) for v in versions.values()),
        "policy-1 scaled away: out of the stack, not restarted, its consumer gone, what it held taken over":
            away.get("scale_exit") == 0 and away.get("in_stack") is False and away.get("consumer_left") is True
            and away.get("left") == 0 and away.get("left_after_reclaim") == 0,
        "policy-1 scaled away paused mid-rollout handed its unfinished prompts back (its log says how many)":
            (away.get("engine_paused") or 0) > 0 and (away.get("handed_back_said") or 0) > 0,
        "policy-1 restarted exactly twice (its load killed, its engine stopped) before it was scaled away":
            away.get("restarts") == 2,
        # Its prompts go back as it leaves, or, where the reclaim time is shorter than the watchdog's look, its
        # lapsed leases go to the other replica first: either way within the stall limit plus one reclaim.
        "a replica whose engine core was stopped turned NOT_SERVING and stopped after the stall limit (its log says "
        "so), and its prompts ran on the other replica within the stall limit plus one reclaim":
            engine.get("stall_said") is True and engine.get("ran_elsewhere") == len(engine.get("held", [None]))
            and engine.get("taken_over_s", math.inf) <= STALL_S + chaos.reclaim_ms / 1000,
        "the replica whose engine stopped came back and loaded the running trainer's current version":
            engine.get("same_trainer") is True,
        "a shard down for five minutes failed searches (a worker said the retriever was down), dead-lettered no "
        "prompt, and rollouts came again within a minute of its return":
            shard_down.get("down_s", 0) >= SHARD_DOWN_S and (shard_down.get("retriever_down_said") or 0) > 0
            and shard_down.get("dead_lettered_meanwhile") == []
            and shard_down.get("rollouts_again") is True and shard_down.get("rollouts_again_after_s", math.inf) <= 60,
        "a Score call failed while the reward service was down, and its prompts went back at once (handed back "
        "or taken again, a delivery counted) and were trained again after its restart":
            reward.get("score_failed") is True and bool(reward.get("state_when_said"))
            and all(went_back(state, reward["failed_delivery"][task]) for task, state in
                    reward["state_when_said"].items())
            and len(reward.get("failed", [])) > 0 and all(task in by_task for task in reward["failed"]),
        # A killed replica's successor hands its predecessor's prompts back when it first takes, once its engine
        # is up: where that restart outlasts the reclaim time (a short --reclaim-ms), the other replica takes
        # them over first, as it should; so do a paused or stalled replica's. A live, healthy one's, never.
        "no prompt waited for the reclaim time but those of a replica a fault had out of service at the time":
            bool(takeovers) and all(out_of_service(t, chaos.faults) for t in takeovers),
        "the trainer rode out the Redis restart (same process, next update)":
            fault["redis killed"].get("same_trainer") is True,
        "a replica killed half-way through a weight load loaded the current version, same trainer":
            fault["load killed half-way through"].get("killed_mid_load") is True
            and fault["load killed half-way through"].get("same_trainer") is True,
    }
    return {
        "checks": checks,
        "prompts_admitted": tasks,
        "outcomes": dict(outcome),
        "dead_letter_reasons": dict(reasons),
        "rollouts_dropped_stale": stale,
        "rollout_ids_produced_twice": sum(1 for c in produced.values() if c > 1),
        "first_prompts": firsts,
        "rollouts_trained": len(trained),
        "taken_over_after_the_reclaim_time": takeovers,
        "rollouts_trained_by_replica": dict(trained_by),
        "rollout_versions_by_replica": {name: dict(Counter(v)) for name, v in versions.items()},
        "replica_versions": served,
        "restarts": restarts,
        "trainer_kills": chaos.trainer_kills,
        "faults": {f.name: {k: v for k, v in f.detail.items() if k not in ("held", "trainer_pid")}
                   | {"held": len(f.detail.get("held", [])), "began": f.began, "ended": f.ended}
                   for f in chaos.faults},
    }


FIRST = re.compile(r"first prompts taken at ([0-9.]+) serving v(\d+) \(sha256 ([0-9a-f]+)\)")


def out_of_service(takeover: dict[str, Any], faults: list[Fault]) -> bool:
    """Whether a take-over came while a fault had the replica it took from out of service (``OUT_OF_SERVICE``),
    from the fault's start to its end."""
    return any(OUT_OF_SERVICE.get(f.name) == takeover["from"] and f.began is not None
               and f.began <= takeover["at"] <= (f.ended if f.ended is not None else math.inf) for f in faults)


def went_back(state: str, failed_delivery: int) -> bool:
    """Whether a prompt in ``state`` (``Chaos.prompt_state``) left the worker whose delivery failed: parked to be
    handed out again, taken again on a later delivery, or trained already; not held on the delivery that failed."""
    held = re.fullmatch(r"held by \S+ on delivery (\d+)", state)
    return state in ("handed back", "acknowledged") or (held is not None and int(held[1]) > failed_delivery)


def took_over(supervisor: Supervisor) -> list[dict[str, Any]]:
    """Every take-over of prompts whose owner had stopped renewing its lease, from the replicas' logs: when (wall
    clock), who took how many from whom."""
    out = []
    for log in sorted(supervisor.log_dir.glob("policy*.log")):
        for match in TOOK_OVER.finditer(log.read_text(errors="replace")):
            at = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
            for part in match[4].split(", "):
                count, _, owner = part.partition(" entries from ")
                out.append({"at": round(at, 3), "by": match[3], "from": owner, "entries": int(count),
                            "idle_ms": int(match[5])})
    return out


def first_prompts(supervisor: Supervisor, announcements: list[fleet.Announcement]) -> list[dict[str, Any]]:
    """Each replica life's first prompts, from its log, held against the announcements in Redis: the version it
    served must be announced with the digest it served, and no newer version may have been announced more than
    a couple of seconds before (the moment a version is announced, a replica may still take prompts on the one
    before: they finish on it, by the fence)."""
    out = []
    for log in sorted(supervisor.log_dir.glob("policy*.log")):
        for match in FIRST.finditer(log.read_text(errors="replace")):
            at, version, sha = float(match[1]), int(match[2]), match[3]
            same = [a for a in announcements if a.version == version]
            newer = [a.version for a in announcements if a.version > version and a.at < at - 2]
            out.append({"replica": log.stem, "at": at, "version": version, "newer_announced_before": newer,
                        "ok": bool(same) and same[0].sha256 == sha and not newer})
    return out


# A call of each service that needs no particular request (an empty Score is refused as invalid, after auth).
CALLS = {"retriever-shard": "RetrieverShard/ShardInfo", "retriever": "Retriever/Info", "reward": "Reward/Score",
         "policy": "Policy/GetWeightVersion", "trainer": "Trainer/Status"}


def refusals(supervisor: Supervisor) -> dict[str, dict[str, str]]:
    """Per service: the status of one call without the token and with it; and Redis without its password."""
    assert supervisor.auth is not None
    token = supervisor.auth.token
    out = {}
    for spec in supervisor.specs:
        method = "/ragr1.v1." + next(m for prefix, m in CALLS.items() if spec.name.startswith(prefix))
        with grpc.insecure_channel(spec.target) as channel:
            call = channel.unary_unary(method)
            codes = {}
            for label, metadata in (("without token", ()), ("with token", (("authorization", f"Bearer {token}"),))):
                try:
                    call(b"", timeout=10, metadata=metadata)
                    codes[label] = "OK"
                except grpc.RpcError as exc:
                    codes[label] = exc.code().name
        out[spec.name] = codes
    assert supervisor.redis is not None
    bare: Any = redis.Redis(host=supervisor.redis.host, port=supervisor.redis.port)
    try:
        bare.xlen(PROMPTS)
        out["redis"] = {"without password": "OK"}
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        out["redis"] = {"without password": type(exc).__name__}
    finally:
        bare.close()
    return out


def secrets_exposed(supervisor: Supervisor, max_bytes: int = 20 << 20) -> list[str]:
    """Where the token or the Redis password appears: any file of the run folder up to ``max_bytes`` (logs,
    step logs, checkpoint metadata; not the secret files themselves) and the command line of any process."""
    assert supervisor.auth is not None
    secrets = [supervisor.auth.token.encode(), supervisor.auth.redis_password.encode()]
    kept = {supervisor.auth.token_file, supervisor.auth.redis_password_file}
    found = []
    for path in supervisor.run_dir.rglob("*"):
        if path.is_file() and path not in kept and path.stat().st_size <= max_bytes:
            data = path.read_bytes()
            found += [str(path) for secret in secrets if secret in data]
    for pid, cmdline in command_lines().items():
        found += [f"the command line of pid {pid}" for secret in secrets if secret in cmdline]
    return found


def command_lines() -> dict[int, bytes]:
    """pid -> command line of every process on this machine (those that exit meanwhile left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
    return found


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def engine_processes() -> set[int]:
    """vLLM's engine-core and worker processes of this user (they name themselves ``VLLM::…``); a container's,
    run as its own user, are not the stack's."""
    uid = os.getuid()
    found = set()
    for pid, cmdline in command_lines().items():
        with contextlib.suppress(OSError):
            if cmdline.startswith(b"VLLM::") and Path(f"/proc/{pid}").stat().st_uid == uid:
                found.add(pid)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=12,
                        help="updates the run trains at least (it ends FINAL_UPDATES after its last fault)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default="")
    parser.add_argument("--base-port", type=int, default=24000)
    parser.add_argument("--reclaim-ms", type=int, default=RECLAIM_MS,
                        help="the rollout workers' reclaim_idle_ms (default: theirs, as deployed)")
    parser.add_argument("--sft-questions", type=int, default=SFT_QUESTIONS,
                        help="SFT questions a source (HotpotQA, PopQA) of the trainer's starting weights")
    parser.add_argument("--sft-epochs", type=int, default=SFT_EPOCHS, help="SFT passes over them")
    parser.add_argument("--sft-checkpoint", default="",
                        help="start from this SFT checkpoint (an earlier run's sft/checkpoints/v000001/policy)")
    args = parser.parse_args(argv)
    timeout = TIMEOUT_S + 2 * args.reclaim_ms / 1000
    config = StackConfig(run_dir=args.run_dir or str(ROOT / "runs" / f"faults-{time.strftime('%Y%m%d-%H%M%S')}"),
                         base_port=args.base_port, max_turns=2, max_tokens_per_turn=64, tokens_per_query=64,
                         max_model_len=2048, kv_cache_gib=1, reward="f1")
    directory = run_dir(config)
    split = questions(args.sft_questions)
    prompts, templates = prompts_file(directory, split)
    supervisor, scaler, model = build(config, directory, split, args.reclaim_ms)
    before = engine_processes()
    print(f"starting the stack; logs in {supervisor.log_dir}", flush=True)
    restarts = RestartPolicy(max_restarts=TRAINER_KILLS + 2, window_seconds=timeout, first_backoff=1.0,
                             max_backoff=5.0)
    with supervisor.start():
        start = (find_model(args.sft_checkpoint, "--sft-checkpoint") if args.sft_checkpoint
                 else sft(supervisor, config, model, split, args.sft_epochs))
        supervisor.add(trainer_spec(config, directory, start, prompts))
        started = time.monotonic()
        refused = refusals(supervisor)
        chaos = Chaos(supervisor, args.updates, args.seed, args.reclaim_ms)
        trainer = supervisor.processes["trainer"]
        gave_up: list[str] = []

        def finished() -> bool:  # one round of the run: the supervisor's watch, the scaler, the chaos
            if trainer.process is not None and trainer.process.poll() == 0:
                return True
            reason = supervisor.watch(restarts)
            if reason is not None:
                gave_up.append(reason)
                return True
            scaler.tick()
            chaos.step()
            return False

        if not poll_until(finished, started + timeout - time.monotonic(), 0.5):
            print(f"the run did not finish in {timeout:.0f} s; logs in {supervisor.log_dir}", flush=True)
            return 1
        if gave_up:
            print(gave_up[0], flush=True)
            return 1
        seconds = time.monotonic() - started
        at_rest = drained(supervisor)
        report = audit(supervisor, templates, chaos) | {"seconds": round(seconds, 1),
                                                                      "reclaim_idle_ms": args.reclaim_ms}
        report["checks"]["the workers finished every prompt admitted before the trainer stopped"] = at_rest
        report["auth"] = refused
        report["checks"]["every service refuses a call without the token, Redis one without its password"] = (
            all(codes.get("without token") == "UNAUTHENTICATED" and codes.get("with token") != "UNAUTHENTICATED"
                for name, codes in refused.items() if name != "redis")
            and refused["redis"]["without password"] == "AuthenticationError")
        report["secrets_exposed"] = secrets_exposed(supervisor)
        report["checks"]["no secret in any file of the run (logs included) or on any command line"] = (
            not report["secrets_exposed"])
    # A killed policy's vLLM processes must not outlive it (they hold the model's memory, and a restart
    # would fail for want of it): none of those started during the run may be left 2 s after it.
    poll_until(lambda: not engine_processes() - before, 2, 0.2)
    report["engine_processes_left"] = len(engine_processes() - before)
    report["checks"]["no vLLM process left behind"] = report["engine_processes_left"] == 0
    (directory / "faults.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    failed = [name for name, ok in report["checks"].items() if not ok]
    print(f"{'FAILED: ' + '; '.join(failed) if failed else 'all checks passed'} ({seconds / 60:.1f} min); "
          f"report {directory / 'faults.json'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
