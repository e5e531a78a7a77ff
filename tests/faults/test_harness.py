"""The fault harness's own rules: its audit of take-overs, on log lines as the replicas write them (only a replica
a fault had out of service at the time may lose prompts to a reclaim), and where it ends the run."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import SimpleNamespace

from tests.faults.harness import FINAL_UPDATES, Chaos, Fault, out_of_service, took_over


def _wall(hms: str) -> float:
    return time.mktime(time.strptime(f"2026-12-02 {hms}", "%Y-%m-%d %H:%M:%S"))


def test_a_take_over_counts_only_while_a_fault_has_its_replica_out_of_service(tmp_path: Path) -> None:
    (tmp_path / "policy.log").write_text(
        "2026-12-02 20:00:08,301 WARNING ragr1.services.common.streams: prompts: policy took over 1 entries from "
        "policy-1, idle for 60000 ms or more\n")
    (tmp_path / "policy-1.log").write_text(
        "(EngineCore pid=1) INFO 12-02 19:51:00 [core.py:1] not a take-over\n"
        "2026-12-02 19:51:29,370 WARNING ragr1.services.common.streams: prompts: policy-1 took over 2 entries from "
        "policy, 1 entries from policy-2, idle for 60000 ms or more\n")
    takeovers = took_over(SimpleNamespace(log_dir=tmp_path))  # type: ignore[arg-type]
    assert [(t["by"], t["from"], t["entries"]) for t in takeovers] == [
        ("policy-1", "policy", 2), ("policy-1", "policy-2", 1), ("policy", "policy-1", 1)]
    assert takeovers[0]["at"] == _wall("19:51:29") + 0.370
    faults = [Fault("worker paused past the reclaim time", 4, True, {}, _wall("19:58:47"), _wall("20:02:10")),
              Fault("worker killed", 5, True, {}, _wall("20:02:11"), _wall("20:03:00")),
              Fault("shard down for five minutes", 10, True, {}, _wall("19:50:00"), _wall("19:55:00"))]
    live, other, paused = takeovers
    assert out_of_service(paused, faults)  # policy-1 was paused then
    assert not out_of_service(live, faults)  # policy was serving: its lease should have held
    assert not out_of_service(other, faults)  # no fault takes policy-2 out
    # A fault still under way covers what comes after its start.
    assert out_of_service(live, [Fault("worker killed", 5, False, {}, _wall("19:50:00"))])


class _Trainer:
    def __init__(self) -> None:
        self.signals: list[int] = []

    def alive(self) -> bool:
        return not self.signals

    def signal(self, number: int) -> None:
        self.signals.append(number)


def _chaos(updates: int) -> Chaos:
    chaos = Chaos.__new__(Chaos)  # the end rule alone: no stack
    chaos.updates, chaos.stop_at, chaos.stop_sent = updates, None, False
    return chaos


def test_the_run_ends_final_updates_after_its_last_fault_and_not_before_its_updates() -> None:
    """However many updates the faults spanned (the machine's speed), the trainer is stopped FINAL_UPDATES past
    the version at which the last one was over, once, with SIGTERM; and never before ``--updates``."""
    chaos, trainer = _chaos(updates=12), _Trainer()
    chaos._end(40, trainer)  # type: ignore[arg-type]
    assert chaos.stop_at == 40 + FINAL_UPDATES and trainer.signals == []
    chaos._end(40 + FINAL_UPDATES - 1, trainer)  # type: ignore[arg-type]
    assert trainer.signals == []
    chaos._end(40 + FINAL_UPDATES, trainer)  # type: ignore[arg-type]
    chaos._end(40 + FINAL_UPDATES + 1, trainer)  # type: ignore[arg-type]
    assert trainer.signals == [signal.SIGTERM]
    early, trainer = _chaos(updates=12), _Trainer()
    early._end(3, trainer)  # type: ignore[arg-type]
    assert early.stop_at == 12
