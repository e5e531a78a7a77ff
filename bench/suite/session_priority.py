"""What a `nice -n 19` process takes from work running beside it, in a session of its own or in the work's.

Where the kernel schedules sessions as groups (sched_autogroup, /proc/sys/kernel/sched_autogroup_enabled), it first
shares the CPU between sessions, and niceness only orders the processes within one: a niced process in a session of
its own takes as much as the whole session it runs beside. `make test` starts mypy in the background at nice 19
(tests/common/background_mypy.py) for the idle time its tests leave. Two busy processes of fixed work, one per core,
are timed alone, then beside a busy nice-19 process in its own session, then beside one in theirs; each mode runs
``--rounds`` times, interleaved, and its mean is printed with its ratio to the work alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = ("alone", "own session", "same session")
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _busy(iterations: int) -> list[str]:
    return [sys.executable, "-c", f"x = 0\nfor i in range({iterations}): x += i"]


def background(mode: str) -> subprocess.Popen[bytes] | None:
    """The nice-19 busy process of a mode (none alone): a new session, or a process group of its own in ours."""
    if mode == "alone":
        return None
    command = ["nice", "-n", "19", sys.executable, "-c", "while True: pass"]
    if mode == "own session":
        return subprocess.Popen(command, start_new_session=True)
    return subprocess.Popen(command, process_group=0)


def timed(mode: str, iterations: int, workers: int) -> float:
    """Seconds for ``workers`` busy processes of ``iterations`` each, beside the mode's background process."""
    hog = background(mode)
    try:
        time.sleep(0.2)  # the background process running before the work starts
        start = time.perf_counter()
        work = [subprocess.Popen(_busy(iterations)) for _ in range(workers)]
        for process in work:
            process.wait()
        return time.perf_counter() - start
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=60_000_000, help="loop steps of each busy process")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, interleaved")
    args = parser.parse_args(argv)
    workers = os.cpu_count() or 1
    autogroup = AUTOGROUP.read_text().strip() if AUTOGROUP.exists() else "absent"
    print(f"{workers} busy processes of {args.iterations:,} steps; sched_autogroup_enabled: {autogroup}")
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            seconds[mode].append(timed(mode, args.iterations, workers))
    means = {mode: sum(values) / len(values) for mode, values in seconds.items()}
    for mode in MODES:
        runs = ", ".join(f"{s:.1f}" for s in seconds[mode])
        print(f"{mode:13s} {means[mode]:6.1f} s (runs {runs})  x{means[mode] / means['alone']:.2f} of alone")
    return means


if __name__ == "__main__":
    main()
