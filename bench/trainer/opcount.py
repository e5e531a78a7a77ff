"""The operators a piece of training code dispatches, counted by name and by phase with torch's profiler.

On a GPU each operator is a launch (or several) of a few microseconds, and a step whose operators are small
waits on the host between them (docs/results/2026-11-27-gpu-check-h100.md): how many a step dispatches per
token says as much about its speed there as its FLOPs. The count does not depend on the device (the same
Python dispatches the same operators), so it is taken on the CPU as well as on a GPU.

Counted: every ``aten::`` operator the profiler records, nested ones included (``aten::to`` and the
``aten::copy_`` inside it are two dispatches). Except inside a multi-tensor operator (``_foreach_*``, the fused
optimiser steps): a GPU runs one of those as a few kernels over all its tensors, while the CPU's version loops
over them through the dispatcher; its own entry counts once, as on a GPU.

Phases: methods wrapped in a labelled ``record_function`` while counting (``Phase``); an operator belongs to
the innermost phase it ran in, "(other)" outside every phase.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

MULTI_TENSOR_PREFIXES = ("aten::_foreach_", "aten::_fused_")
OTHER = "(other)"


@dataclasses.dataclass(frozen=True)
class Phase:
    """``owner.attribute`` (a method or function, looked up when called; none: nothing to wrap) counted as
    ``label``; ``label`` may be a function of the call's arguments (the model a ``step`` trains)."""

    owner: Any
    attribute: str
    label: str | Callable[..., str]


@dataclasses.dataclass
class Counts:
    by_name: collections.Counter[str]
    by_phase: collections.Counter[str]

    @property
    def total(self) -> int:
        return sum(self.by_name.values())


@contextlib.contextmanager
def phases(wrapped: Sequence[Phase], labels: set[str]) -> Iterator[None]:
    """Each phase's callable runs inside ``record_function(label)``; the labels used are added to ``labels``."""
    from torch.profiler import record_function

    saved = []
    for phase in wrapped:
        original = getattr(phase.owner, phase.attribute, None)
        if original is None:  # code from before the method existed
            continue
        own = phase.attribute in getattr(phase.owner, "__dict__", {})

        def run(*args: Any, _original: Any = original, _phase: Phase = phase, **kwargs: Any) -> Any:
            label = _phase.label if isinstance(_phase.label, str) else _phase.label(*args, **kwargs)
            labels.add(label)
            with record_function(label):
                return _original(*args, **kwargs)

        saved.append((phase, original, own))
        setattr(phase.owner, phase.attribute, functools.wraps(original)(run))
    try:
        yield
    finally:
        for phase, original, own in reversed(saved):
            if own:
                setattr(phase.owner, phase.attribute, original)
            else:
                delattr(phase.owner, phase.attribute)


def _attribution(event: Any, labels: set[str]) -> tuple[bool, str]:
    """(inside a multi-tensor operator, the innermost phase)."""
    inside, phase = False, None
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(MULTI_TENSOR_PREFIXES):
            inside = True
        if phase is None and parent.name in labels:
            phase = parent.name
        parent = parent.cpu_parent
    return inside, phase or OTHER


def count_operators(run: Callable[[], Any], wrapped: Sequence[Phase] = ()) -> Counts:
    """The ``aten::`` operators ``run()`` dispatches, by name and by phase."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    labels: set[str] = set()
    with phases(wrapped, labels), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    by_name: collections.Counter[str] = collections.Counter()
    by_phase: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        inside, phase = _attribution(event, labels)
        if not inside:
            by_name[event.name] += 1
            by_phase[phase] += 1
    return Counts(by_name, by_phase)


def table(columns: dict[str, collections.Counter[str]], per: float, rows: int, title: str) -> str:
    """The keys with the most dispatches in any column (at most ``rows`` of each), per ``per`` tokens."""
    names: list[str] = []
    for counts in columns.values():
        names += [name for name, _ in counts.most_common(rows) if name not in names]
    width = max(len(n) for n in [*names, title])
    head = f"{title:<{width}}" + "".join(f" {c:>16}" for c in columns)
    lines = [head, "-" * len(head)]
    for name in names:
        lines.append(f"{name:<{width}}" + "".join(f" {counts[name] / per:>16.2f}" for counts in columns.values()))
    lines.append(f"{'(all)':<{width}}" + "".join(f" {sum(c.values()) / per:>16.2f}" for c in columns.values()))
    return "\n".join(lines)
