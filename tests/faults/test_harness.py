"""The fault harness's audit of take-overs, on log lines as the replicas write them: only a replica a fault had
out of service at the time may lose prompts to a reclaim."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from tests.faults.harness import Fault, out_of_service, took_over


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
