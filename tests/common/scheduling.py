"""How `make test` hands modules to its xdist workers: whole modules (a module's fixtures start on one worker only),
some modules together on one worker where they share session fixtures too costly to start twice, and the longest
first, so that none of them starts last and leaves one worker running alone at the end.

(xdist's own `--dist loadgroup` would group modules, but it marks groups by rewriting the nodeid, which pytest 9
no longer reads back: it falls back to one test at a time, every module fixture on every worker.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

from ragr1.shipped import ROOT

# Modules handed out first, in this order (the profiles on docs/results/); a group goes where its first module is.
LONG_MODULES = (
    "tests/policy/test_integration.py",
    "tests/policy/test_async_rollouts.py",
    "tests/policy/test_engine.py",
    "tests/trainer/test_learning.py",
    "tests/trainer/test_ray_train.py",
    "tests/retriever/test_import.py",
    "tests/trainer/test_loop.py",
)

# One worker runs all of a group. The policy modules, the scale rig's and the SFT search's (train sft, data
# prepare) share the session's retriever and reward servers (tests/common/servers.py); the async loop's and the
# engine's modules share its in-process vLLM engine (tests/common/engine.py).
GROUPS = {
    "policy services and the in-process engine": (
        "tests/policy/test_integration.py",
        "tests/policy/test_async_rollouts.py",
        "tests/policy/test_engine.py",
        "tests/policy/test_retrieval.py",
        "tests/policy/test_runtime.py",
        "tests/policy/test_streaming.py",
        "tests/policy/test_worker.py",
        "tests/bench/test_scale_rig.py",
        "tests/trainer/test_sft_search.py",
        "tests/stack/test_prepare.py",
    ),
}
_GROUP_OF = {module: group for group, modules in GROUPS.items() for module in modules}



def module_of(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(ROOT).as_posix()


def order(items: list[pytest.Item]) -> None:
    """The long modules first, in their order, and each group's modules next to each other; a stable sort, so that
    every worker collects the same order, which the scheduler keeps under --no-loadscope-reorder."""
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    first = {group: min(rank.get(m, len(rank)) for m in modules) for group, modules in GROUPS.items()}

    def key(item: pytest.Item) -> tuple[int, int]:
        module = module_of(item)
        group = _GROUP_OF.get(module)
        return (first[group] if group else rank.get(module, len(rank)), rank.get(module, len(rank)))

    items.sort(key=key)


class GroupedFileScheduling(LoadFileScheduling):
    """xdist's `--dist loadfile`, with the modules of a group as one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return _GROUP_OF.get(module, module)
