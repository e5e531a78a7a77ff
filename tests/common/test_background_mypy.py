"""The background mypy run of `make test` takes only what the tests leave: lowest priority, in the run's own session
(where the kernel schedules sessions as groups, a session of its own would make it the run's equal)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.common import background_mypy


def test_the_background_run_is_niced_in_the_run_s_session_and_its_result_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stands in for mypy: reports where it runs, and exits as mypy does when it finds errors.
    probe = tmp_path / "probe"
    probe.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "print(os.getsid(0), os.getpgid(0), os.getpid(), os.getppid(), os.nice(0))\n"
        "sys.exit(1)\n"
    )
    probe.chmod(0o755)
    monkeypatch.setattr(background_mypy, "MYPY", probe)
    monkeypatch.delenv(background_mypy.RESULT, raising=False)
    process = background_mypy.start()
    try:
        outcome = background_mypy.result(timeout=60)
    finally:
        background_mypy.stop(process)
    assert outcome is not None
    rc, output = outcome
    session, group, pid, parent, niceness = (int(x) for x in output.split())
    assert rc == 1
    assert session == os.getsid(0), "mypy runs in a session of its own: it competes with the tests as an equal"
    assert niceness == 19
    # Its own process group (the shell's, which the probe's parent leads), so that stop() kills mypy and nothing else.
    assert group == parent == process.pid != os.getpgid(0) and pid != process.pid
    assert background_mypy.RESULT not in os.environ
