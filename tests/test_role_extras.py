"""Each role's image holds its own extra alone (docker/Dockerfile's targets, pyproject.toml's extras), and the
``ragr1`` command its containers run must start there: building its parser imports every service's flags, so a
module of another role's extra imported at the top of any of them fails the command in every image that lacks
it. Here each role's commands run in a fresh interpreter where every module that ``ragr1.cli`` names as another
extra's cannot be imported, as in that role's image (``make test-docker`` runs the images themselves)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragr1.cli import EXTRA_OF_MODULE

# The extras each role's image installs, and the command lines its containers run (tests/deploy/test_commands.py
# holds which command runs in which image).
ROLES = {
    "reward": ({"server", "reward"}, [["serve", "reward"]]),
    "retriever": ({"server", "retriever"}, [["serve", "retriever"], ["serve", "retriever-shard"]]),
}

RUN_WITHOUT = """
import sys
blocked = set(sys.argv[1].split(","))

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
from ragr1.cli import main
sys.argv = ["ragr1", *sys.argv[2:]]
sys.exit(main())
"""


def absent_from(role: str) -> list[str]:
    extras, _ = ROLES[role]
    return sorted(module for module, extra in EXTRA_OF_MODULE.items() if extra not in extras)


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_roles_commands_start_without_the_other_roles_modules(role: str) -> None:
    absent = absent_from(role)
    for command in ROLES[role][1]:
        result = subprocess.run([sys.executable, "-c", RUN_WITHOUT, ",".join(absent), *command, "--help"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "usage: ragr1 " + " ".join(command) in result.stdout, (command, result.stdout[-500:])


def test_the_absent_modules_are_what_the_role_lacks_and_a_missing_one_is_named_with_its_extra() -> None:
    # The check bites: the reward image lacks the retriever's kernel and the trainer's torch, and a module the
    # command does import, made absent the same way, stops it with the line that names its extra.
    assert {"numba", "faiss", "torch", "vllm"} <= set(absent_from("reward"))
    assert "numba" not in absent_from("retriever") and "torch" in absent_from("retriever")
    result = subprocess.run([sys.executable, "-c", RUN_WITHOUT, "yaml", "serve", "reward", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "this command needs the 'server' extra" in result.stderr, result.stderr[-2000:]
