"""Services die with the process that started them, however it dies: a SIGKILLed owner leaves no child
(and no grandchild) holding a port or memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from ragr1.services.common.redis_server import free_port
from ragr1.stack.supervisor import port_in_use
from tests.common.waiting import wait_for

OWNER = """
import sys, time
from pathlib import Path
from ragr1.services.common.process import ServiceProcess
proc = ServiceProcess.ragr1("redis", ["redis", "--port", sys.argv[1]], None, Path(sys.argv[2])).launch()
print(proc.process.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigkilled_owner_takes_its_services_and_their_children_with_it(tmp_path: Path) -> None:
    port = free_port()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(port), str(tmp_path / "redis.log")],
                             stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert owner.stdout is not None
        service = int(owner.stdout.readline())
        # `ragr1 redis` -> redis-server, a grandchild of the owner
        wait_for(lambda: port_in_use("127.0.0.1", port), lambda: (tmp_path / "redis.log").read_text(), 60, 0.1)
        family = [service, *(child.pid for child in psutil.Process(service).children(recursive=True))]
        assert len(family) >= 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    wait_for(lambda: all(gone(pid) for pid in family) and not port_in_use("127.0.0.1", port),
             f"still running after their owner was killed: {family}", 10, 0.1)
