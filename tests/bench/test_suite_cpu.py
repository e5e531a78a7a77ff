"""bench/suite/cpu.py: the kernel's accounting records read back (a real one, where the test may turn accounting
on), each process tree charged to the test its worker was running when the tree's first process began, and the
plugin's line a test."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suite.cpu import (
    LOG_ENV,
    Process,
    Timing,
    attribute,
    comp_t,
    read_accounting,
    read_tests,
    report,
    set_accounting,
)

ROOT = Path(__file__).resolve().parents[2]


def _record(pid: int, ppid: int, begin: int, user: int, system: int, command: bytes, version: int = 3) -> bytes:
    return struct.pack("<BBHIIIIIIf8H16s", 0, version, 0, 0, 0, 0, pid, ppid, begin, 0.0, user, system,
                       0, 0, 0, 0, 0, 0, command)


def test_comp_t_and_records_decode_and_other_versions_are_refused() -> None:
    assert comp_t(0x1FFF) == 8191 and comp_t(0x2001) == 8 and comp_t((2 << 13) | 3) == 3 * 64
    data = _record(7, 1, 1000, 150, 0x2001, b"python") + _record(8, 7, 1001, 0, 0, b"ray::RayTrainWorker"[:16])
    first, second = read_accounting(data)
    assert first == Process(7, 1, 1000, (150 + 8) / 100, "python")
    assert second.command == "ray::RayTrainWor" and second.ppid == 7
    with pytest.raises(ValueError, match="not a whole number"):
        read_accounting(data[:-1])
    with pytest.raises(ValueError, match="version 2"):
        read_accounting(_record(7, 1, 1000, 1, 1, b"x", version=2))


def test_a_process_tree_is_charged_to_the_test_its_worker_ran_when_it_began() -> None:
    tests = [
        Timing(100, 1000.2, 1005.0, 1.5, "tests/a.py::one"),
        Timing(100, 1005.0, 1010.5, 0.5, "tests/b.py::two"),
        Timing(101, 1000.0, 1020.0, 4.0, "tests/b.py::three"),
    ]
    processes = [
        Process(200, 100, 1001, 2.0, "python"),  # a's server ...
        Process(201, 200, 1003, 3.0, "VLLM::EngineCor"),  # ... and its engine
        Process(300, 100, 1005, 1.0, "python"),  # began in the second b started: b's
        Process(400, 100, 999, 9.0, "python"),  # before the worker's first test: nobody's
        Process(500, 1, 1002, 7.0, "raylet"),  # its parent gone first: nobody's
        Process(600, 101, 1010, 0.25, "redis-server"),
    ]
    modules, trees = attribute(tests, processes)
    assert modules["tests/a.py"].worker_cpu == 1.5 and modules["tests/a.py"].process_cpu == 5.0
    assert modules["tests/a.py"].processes == 2
    assert modules["tests/b.py"].worker_cpu == 4.5 and modules["tests/b.py"].process_cpu == 1.25
    assert modules["tests/b.py"].wall == pytest.approx(5.5 + 20.0)
    assert trees[0] == (5.0, "python", "tests/a.py::one")
    assert sum(cpu for cpu, _, _ in trees) == 6.25


def test_the_report_ranks_modules_by_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    tests = [Timing(100, 0.0, 10.0, 1.0, "tests/light.py::t"), Timing(100, 10.0, 20.0, 2.0, "tests/heavy.py::t")]
    report(0, 20.0, 30.0, tests, [Process(200, 100, 12, 5.0, "python")], top=5)
    out = capsys.readouterr().out
    assert "the tests: 8 cpu-s, 3 in the pytest workers and 5 in the processes they started" in out
    lines = [line for line in out.splitlines() if line.startswith("tests/")]
    assert lines[0].split()[:4] == ["tests/heavy.py", "7.0", "2.0", "5.0"] and lines[1].startswith("tests/light.py")


def test_the_plugin_writes_a_line_for_each_test_where_it_runs(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text("def test_a():\n    sum(range(10**6))\n\ndef test_b():\n    pass\n")
    log = tmp_path / "tests.log"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.suite.cpu", str(tmp_path)],
        cwd=ROOT, env={**os.environ, LOG_ENV: str(log), "PYTEST_ADDOPTS": ""}, capture_output=True, text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = read_tests(log.read_text())
    assert [run.nodeid.split("::")[1] for run in runs] == ["test_a", "test_b"]
    assert len({run.pid for run in runs}) == 1 and runs[0].pid != os.getpid()
    assert all(run.end >= run.start and run.cpu >= 0 for run in runs) and runs[0].cpu > runs[1].cpu


def test_the_kernel_records_a_childs_parent_and_cpu(tmp_path: Path) -> None:
    if os.environ.get(LOG_ENV):
        pytest.skip("bench/suite/cpu.py's own accounting is on; turning it on here would take its records")
    accounting = tmp_path / "acct"
    accounting.touch()
    try:
        set_accounting(accounting)
    except OSError as error:
        pytest.skip(str(error.strerror))
    try:
        child = subprocess.run(
            [sys.executable, "-c", "import os, time\nend = time.process_time() + 0.5\n"
             "while time.process_time() < end: pass\nprint(os.getpid())"],
            capture_output=True, text=True, check=True,
        )
    finally:
        set_accounting(None)
    pid = int(child.stdout)
    records = [p for p in read_accounting(accounting.read_bytes()) if p.pid == pid]
    # The kernel suspends accounting while the file's filesystem has less free space than kernel.acct's first
    # figure (per cent): then no record is written, and the message says so.
    free = shutil.disk_usage(accounting).free / shutil.disk_usage(accounting).total
    assert len(records) == 1, (f"{len(records)} accounting records of the child; free space {free:.1%} "
                               f"(kernel.acct: {Path('/proc/sys/kernel/acct').read_text().strip()})")
    (record,) = records
    assert record.ppid == os.getpid() and record.command.startswith("python")
    # The record's CPU time counts the clock ticks that found the child running, which on a busy machine fall well
    # short of the time it measured itself: half of that is the floor.
    assert 0.25 <= record.cpu <= 3.0
