"""A service's child processes go with it: vLLM's engine processes would outlive a SIGKILLed policy, holding
its memory, and the restarted policy would find none for its KV cache."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ragr1.services.common.process import ServiceProcess
from tests.common.waiting import wait_for

# A service that starts a child which ignores its parent's death, as vLLM's engine core does.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead; it waits for its parent (init, here) to reap it
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def child_of(service: ServiceProcess, pid_file: Path) -> int:
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), service.log_tail, 30, 0.05)
    return int(pid_file.read_text())


def wait_gone(pid: int, what: str) -> None:
    wait_for(lambda: not alive(pid), what, 10, 0.05)


def test_a_killed_service_leaves_no_child_behind_once_restarted_or_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    service = ServiceProcess("svc", [sys.executable, "-c", PARENT, str(pid_file)], None, tmp_path / "svc.log")
    service.launch()
    first = child_of(service, pid_file)
    pid_file.unlink()
    service.signal(signal.SIGKILL)  # as the kernel's OOM killer or a chaos test would
    assert service.process is not None and service.process.wait(10) == -signal.SIGKILL
    assert alive(first), "the child must outlive its parent here, or this test proves nothing"
    service.launch()  # the supervisor's restart
    wait_gone(first, "the restart left the killed service's child running")
    second = child_of(service, pid_file)
    service.stop(timeout=5)
    wait_gone(second, "stop left the service's child running")
