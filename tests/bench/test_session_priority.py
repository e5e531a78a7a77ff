"""bench/suite/session_priority.py: its background process niced in the session each mode names, and every mode
timed."""

from __future__ import annotations

import os

import psutil
import pytest

from bench.suite.session_priority import MODES, background, main
from tests.common.waiting import wait_for


@pytest.mark.parametrize("mode", ["own session", "same session"])
def test_the_background_process_is_niced_in_the_session_its_mode_names(mode: str) -> None:
    hog = background(mode)
    assert hog is not None
    try:
        process = psutil.Process(hog.pid)
        # `nice` has exec'd the busy loop by the time it runs Python.
        wait_for(lambda: "python" in process.name().lower(), "the background process never started its loop", 30)
        assert process.nice() == 19
        assert (os.getsid(hog.pid) == os.getsid(0)) == (mode == "same session")
        assert os.getpgid(hog.pid) == hog.pid != os.getpgid(0)
    finally:
        hog.kill()
        hog.wait()
    assert background("alone") is None


def test_every_mode_is_timed_against_the_work_alone(capsys: pytest.CaptureFixture[str]) -> None:
    means = main(["--iterations", "1000", "--rounds", "1"])
    assert list(means) == list(MODES) and all(s > 0 for s in means.values())
    out = capsys.readouterr().out
    assert all(f"x{means[m] / means['alone']:.2f} of alone" in out for m in MODES)
    # Nothing of its own left running (the session's servers of other tests may be).
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "while True" in " ".join(child.cmdline()):
                left.append(child)
        except psutil.NoSuchProcess:
            pass
    assert not left
