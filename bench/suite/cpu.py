"""Where `make test`'s CPU goes, by test module: each pytest worker's own CPU in each test, and every process a test
starts, with all its descendants, charged to the test running on that worker when it started.

    python bench/suite/cpu.py [--top 25] [--dir CHECKOUT]

It runs `make test` in CHECKOUT (default this one; a fresh clone times its set-up too) with the kernel's BSD process
accounting on (acct(2): one record a process at its exit, killed ones included, so a server that a fixture
SIGKILLs is counted too; root only). On a suite that keeps both cores busy, CPU seconds are the figure that adds
up: `--durations` gives wall seconds, which stretch with whatever else holds the cores. Processes whose parent
exited first are re-parented by the kernel and show as unattributed.

Also a pytest plugin (``-p bench.suite.cpu``, which the run adds through PYTEST_ADDOPTS): where a test runs, it
appends ``pid start end cpu nodeid`` to the file named by RAGR1_SUITE_CPU_LOG.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

LOG_ENV = "RAGR1_SUITE_CPU_LOG"
ROOT = Path(__file__).resolve().parents[2]
# struct acct_v3 (linux/acct.h): flag, version, tty, exit code, uid, gid, pid, ppid, begin time (s), elapsed
# (float, ticks), then eight comp_t (user, system, memory, io, rw, minor and major faults, swaps) and the command.
_ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100  # comp_t and ac_etime count in these ticks a second


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    begin: int  # seconds since the epoch, truncated
    cpu: float  # user + system seconds
    command: str


@dataclass(frozen=True)
class Timing:
    pid: int
    start: float
    end: float
    cpu: float
    nodeid: str

    @property
    def module(self) -> str:
        return self.nodeid.split("::")[0]


def comp_t(value: int) -> int:
    """The kernel's comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(data: bytes) -> list[Process]:
    """The records of an accounting file; anything other than version 3 records is refused."""
    if len(data) % _ACCT_V3.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of {_ACCT_V3.size}-byte acct_v3 records")
    processes = []
    for fields in _ACCT_V3.iter_unpack(data):
        version = fields[1]
        if version & 0x0F != 3:
            raise ValueError(f"an accounting record of version {version & 0x0F}; this reads version 3 only")
        pid, ppid, begin = fields[6], fields[7], fields[8]
        user, system = comp_t(fields[10]), comp_t(fields[11])
        command = fields[18].split(b"\0")[0].decode(errors="replace")
        processes.append(Process(pid, ppid, begin, (user + system) / _AHZ, command))
    return processes


def read_tests(text: str) -> list[Timing]:
    runs = []
    for line in text.splitlines():
        pid, start, end, cpu, nodeid = line.split(" ", 4)
        runs.append(Timing(int(pid), float(start), float(end), float(cpu), nodeid))
    return runs


def _descendants(pid: int, children: dict[int, list[Process]]) -> Iterator[Process]:
    for child in children.get(pid, ()):
        yield child
        yield from _descendants(child.pid, children)


def _running(runs: list[Timing], begin: int) -> Timing | None:
    """The test a process that began in second ``begin`` belongs to: the last one its worker started by the end of
    that second (the record keeps whole seconds)."""
    started = [run for run in runs if run.start < begin + 1]
    return max(started, key=lambda run: run.start) if started else None


@dataclass
class Charge:
    worker_cpu: float = 0.0
    process_cpu: float = 0.0
    processes: int = 0
    wall: float = 0.0


def attribute(tests: list[Timing], processes: list[Process]) -> tuple[dict[str, Charge], list[tuple[float, str, str]]]:
    """CPU seconds a module: its tests' own, in their workers, and the process trees they started; and each tree's
    (cpu, command, test), largest first."""
    by_worker: dict[int, list[Timing]] = defaultdict(list)
    for run in tests:
        by_worker[run.pid].append(run)
    children: dict[int, list[Process]] = defaultdict(list)
    for process in processes:
        children[process.ppid].append(process)
    modules: dict[str, Charge] = defaultdict(Charge)
    for run in tests:
        modules[run.module].worker_cpu += run.cpu
        modules[run.module].wall += run.end - run.start
    trees = []
    for worker, runs in by_worker.items():
        for child in children.get(worker, ()):
            owner = _running(runs, child.begin)
            if owner is None:
                continue
            tree = [child, *_descendants(child.pid, children)]
            cpu = sum(p.cpu for p in tree)
            modules[owner.module].process_cpu += cpu
            modules[owner.module].processes += len(tree)
            trees.append((cpu, child.command, owner.nodeid))
    trees.sort(reverse=True)
    return dict(modules), trees


# The plugin half: where tests run (a worker, or pytest's only process), one line each.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start, cpu = time.time(), time.process_time()
    yield
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as log:
            log.write(f"{os.getpid()} {start:.3f} {time.time():.3f} {time.process_time() - cpu:.3f} {item.nodeid}\n")


def _busy_ticks() -> int:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return user + nice + system + irq + softirq + steal


def set_accounting(path: Path | None) -> None:
    """The kernel's process accounting on, into ``path``, or off (None); OSError where it refuses (not root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode() if path else None) != 0:
        error = ctypes.get_errno()
        where = str(path) if path else None
        raise OSError(error, f"acct({where!r}): {os.strerror(error)} (process accounting needs root)")


def measure(checkout: Path, workdir: Path) -> tuple[int, float, float, list[Timing], list[Process]]:
    """Runs `make test` in ``checkout`` under process accounting; returns its exit status, wall seconds, the
    machine's busy CPU seconds over it, the tests and the processes that ended meanwhile."""
    accounting, tests = workdir / "acct", workdir / "tests.log"
    accounting.touch()
    tests.touch()
    environment = {
        **os.environ, LOG_ENV: str(tests),
        # The checkout's own copy of this module (its pytest `pythonpath` has the root on it).
        "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} -p bench.suite.cpu".strip(),
    }
    set_accounting(accounting)
    try:
        ticks, start = _busy_ticks(), time.perf_counter()
        rc = subprocess.run(["make", "test"], cwd=checkout, env=environment, check=False).returncode
        wall, busy = time.perf_counter() - start, (_busy_ticks() - ticks) / os.sysconf("SC_CLK_TCK")
    finally:
        set_accounting(None)
    return rc, wall, busy, read_tests(tests.read_text()), read_accounting(accounting.read_bytes())


def report(rc: int, wall: float, busy: float, tests: list[Timing], processes: list[Process], top: int) -> None:
    modules, trees = attribute(tests, processes)
    in_workers = sum(c.worker_cpu for c in modules.values())
    in_processes = sum(c.process_cpu for c in modules.values())
    print(f"make test: rc {rc}, {len(tests)} tests, wall {wall:.0f} s; the machine busy {busy:.0f} cpu-s "
          f"({busy / wall / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores)")
    rest = busy - in_workers - in_processes
    print(f"the tests: {in_workers + in_processes:.0f} cpu-s, {in_workers:.0f} in the pytest workers and "
          f"{in_processes:.0f} in the processes they started; the rest of the machine's {rest:.0f}: set-up, "
          "pytest's controller, unattributed processes, anything else running")
    print(f"\n{'module':58s} {'cpu-s':>7s} {'worker':>7s} {'procs':>7s} {'n':>4s} {'wall-s':>7s}")
    ranked = sorted(modules.items(), key=lambda item: -(item[1].worker_cpu + item[1].process_cpu))
    for module, charge in ranked[:top]:
        total = charge.worker_cpu + charge.process_cpu
        print(f"{module:58s} {total:7.1f} {charge.worker_cpu:7.1f} {charge.process_cpu:7.1f} {charge.processes:4d} "
              f"{charge.wall:7.1f}")
    print("\nthe largest process trees (cpu-s, the command of its first process, the test that started it):")
    for cpu, command, nodeid in trees[:top]:
        print(f"{cpu:7.1f} {command:16s} {nodeid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT, help="the checkout whose `make test` runs")
    parser.add_argument("--top", type=int, default=25, help="modules and process trees listed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as workdir:
        try:
            rc, wall, busy, tests, processes = measure(args.dir.resolve(), Path(workdir))
        except OSError as error:
            raise SystemExit(error.strerror) from error
    report(rc, wall, busy, tests, processes, args.top)
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
