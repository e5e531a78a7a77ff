"""Child processes die with the process that started them, however it dies.

The local stack starts every service in a session of its own, so that a service's own children (vLLM's
engine-core and worker processes) can be killed with it as one process group. The price is that nothing
the kernel does on its own reaches them when their owner is SIGKILLed or OOM-killed: they would keep
running, holding their ports and gigabytes of memory, and the next ``ragr1 up`` would find its ports taken.

So every owner holds the write end of one pipe, its *lifeline*, and every ``ragr1`` child it starts gets
the read end (``RAGR1_LIFELINE_FD``). A thread in the child waits on it; the pipe reads end-of-file only
when no owner process holds the write end any more, i.e. when the owner is gone, and the child then kills
its process group (itself and its own children). Redis, which is not a ``ragr1`` process, is started with
the kernel's parent-death signal instead (``die_with_parent``): it has no children to take with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading

ENV = "RAGR1_LIFELINE_FD"

_lock = threading.Lock()
_read_end: int | None = None
_write_end: int | None = None


def _forget_in_forked_child() -> None:
    # A forked (not exec'd) copy of the owner would hold the write end and keep every lifeline open after the
    # owner died.
    global _read_end, _write_end
    for fd in (_read_end, _write_end):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _read_end = _write_end = None


os.register_at_fork(after_in_child=_forget_in_forked_child)


def for_child() -> tuple[dict[str, str], tuple[int, ...]]:
    """The environment entry and the file descriptor to hand a ``ragr1`` child (``pass_fds``)."""
    global _read_end, _write_end
    with _lock:
        if _read_end is None:
            # Both ends are non-inheritable: pass_fds opens the read end to each child alone, and the write
            # end never leaves this process.
            _read_end, _write_end = os.pipe()
        return {ENV: str(_read_end)}, (_read_end,)


def watch() -> None:
    """In a ``ragr1`` process started with a lifeline: kill this process's group when the owner is gone.

    The variable is removed, so that processes this one starts get lifelines of their own instead."""
    value = os.environ.pop(ENV, None)
    if value is None:
        return
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        return  # not a lifeline this process holds (a copied environment): nothing to watch

    def wait() -> None:
        while True:
            try:
                if os.read(fd, 1) == b"":
                    break
            except InterruptedError:
                continue
            except OSError:
                return
        # Only a group this process leads is killed: a ragr1 process that shares its group with a shell
        # must not take the shell with it.
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="lifeline", daemon=True).start()


def die_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that the kernel SIGKILLs it when its owner dies (``setpriv --pdeathsig``,
    util-linux). The kernel sends that signal when the *thread* that started the child ends, so only a child
    started from the main thread, which lives as long as the process, gets it; elsewhere, or without
    setpriv, the command is returned unchanged."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return command
    return [setpriv, "--pdeathsig", "KILL", *command]
