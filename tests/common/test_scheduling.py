"""`make test`'s hand-out of modules (tests/common/scheduling.py): every module it names exists, a group's modules
are one unit of work, and the order puts the long modules first with each group's modules together."""

from __future__ import annotations

from tests.common import scheduling


def test_every_module_named_exists() -> None:
    named = {*scheduling.LONG_MODULES, *(m for modules in scheduling.GROUPS.values() for m in modules)}
    missing = sorted(m for m in named if not (scheduling.ROOT / m).is_file())
    assert not missing, f"renamed or removed: {missing}"


def test_a_groups_modules_are_one_unit_and_other_modules_their_own() -> None:
    scheduler = object.__new__(scheduling.GroupedFileScheduling)  # _split_scope reads nothing of its state
    for group, modules in scheduling.GROUPS.items():
        assert {scheduler._split_scope(f"{m}::test_x[a-b]") for m in modules} == {group}
    assert scheduler._split_scope("tests/test_layout.py::test_x") == "tests/test_layout.py"


class _Item:
    def __init__(self, module: str) -> None:
        self.path = scheduling.ROOT / module


def test_long_modules_come_first_and_a_group_stays_together() -> None:
    group = next(iter(scheduling.GROUPS.values()))
    modules = ["tests/test_layout.py", group[-1], "tests/trainer/test_learning.py", "tests/common/test_config.py",
               group[0], group[1]]
    items = [_Item(m) for m in modules]
    scheduling.order(items)  # type: ignore[arg-type]
    ordered = [scheduling.module_of(i) for i in items]  # type: ignore[arg-type]
    # The group first (its first module is the first long one), in its own order; then the next long module;
    # then the rest as collected.
    assert ordered == [group[0], group[1], group[-1], "tests/trainer/test_learning.py", "tests/test_layout.py",
                       "tests/common/test_config.py"]
