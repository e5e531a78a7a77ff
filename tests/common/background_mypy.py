"""mypy run in the background of a multi-worker test run, for tests/test_lint.py.

mypy's first run on a fresh clone (no cache) is long work for one core, while a two-worker run leaves part of
the machine idle as its tests wait on processes. The run's controller, which only hands out tests, starts mypy at
the lowest priority, so that it takes only what the tests leave; the lint test then reads its result. mypy stays in
the run's session: where the kernel groups processes by session for scheduling (sched_autogroup), a process in a
session of its own competes with the whole run as an equal, whatever its niceness.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ragr1 import shipped
from tests.common.waiting import wait_for

# The folder of the background run's output and exit status; the workers inherit it from the controller.
RESULT = "RAGR1_TEST_MYPY_RESULT"
ROOT = shipped.ROOT
LINT_TESTS = ROOT / "tests" / "test_lint.py"
# The lint test's mypy command, here or in the background.
MYPY = Path(sys.executable).parent / "mypy"


def covers(paths: list[Path]) -> bool:
    """Whether a run of these paths includes the lint tests."""
    return any(path == LINT_TESTS or path in LINT_TESTS.parents for path in paths)


def start() -> subprocess.Popen[bytes]:
    out = Path(tempfile.mkdtemp(prefix="ragr1-test-mypy-"))
    script = 'nice -n 19 "$0" > "$1/output" 2>&1; echo $? > "$1/rc.tmp" && mv "$1/rc.tmp" "$1/rc"'
    # A process group of its own, for stop()'s kill.
    process = subprocess.Popen(["sh", "-c", script, str(MYPY), str(out)], cwd=ROOT, process_group=0)
    os.environ[RESULT] = str(out)  # before the workers start
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    """At the run's end: the run ended before mypy (a test selection, a failure with -x), or its output read."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()
    shutil.rmtree(os.environ.pop(RESULT), ignore_errors=True)


def result(timeout: float = 600) -> tuple[int, str] | None:
    """(exit status, output) of the background run, waited for; None when this run started none."""
    folder = os.environ.get(RESULT)
    if not folder:
        return None
    done = Path(folder) / "rc"
    wait_for(done.exists, f"the background mypy run ({folder}) did not finish in {timeout:.0f} s", timeout, poll=1)
    return int(done.read_text()), (Path(folder) / "output").read_text()
