"""Comments say why the code is as it is, never what a run measured or when (docs/development.md): a figure in a
comment is stale the day the code or the machine changes, and nothing re-runs it. Measurements live on the
results pages (docs/results/), which record the command, the commit and the machine.

Checked: the ``#`` comments of ragr1/ and deploy/ (Python, YAML, Helm templates, whose ``{{/* */}}`` comments
too), the demo's presets and the compose files, and their Python docstrings for dates and results links. A
comment may not carry an ISO date, a link to a results page, or a measured figure. "Measured" is kept narrow, so
that settings and design bounds ("a 5 s deadline", "16 GiB of memory", "95% intervals", "0.7 of the GPU") stay
allowed: a figure is a number with a fractional part and a unit of time, size, rate or share ("42.8 min",
"4.27 GiB", "12.5%"), a ratio written as one ("x0.74", "1.81×"), or a share of the time ("0.83 of the time").
Sizes and figures worth keeping go to the docs, with their command.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
RESULTS = re.compile(r"docs/results/|\bresults/20\d\d-")
_UNIT = (r"(?:ms|us|µs|s|sec|seconds|min|minutes|h|hours|GiB|GB|MiB|MB|KiB|KB|TiB|TB|%|x|×"
         r"|tokens/s|tok/s|calls/s|queries/s|it/s|cpu-s)")
FIGURE = re.compile(
    rf"(?<![\w.])\d[\d,]*\.\d+\s?{_UNIT}(?![\w/])"  # 42.8 min, 4.27 GiB, 12.5%, 1.81x
    r"|(?<![\w.])[x×]\d+\.\d+\b"  # x0.74, ×1.30
    r"|(?<![\w.])\d+\.\d+ of the time\b"  # 0.83 of the time
)


def findings(comment: str) -> list[str]:
    """What in one comment's text is not a why: each date, results link and measured figure found."""
    return [f"{kind} {m.group(0)!r}" for kind, pattern in (("date", DATE), ("results link", RESULTS),
                                                              ("measured figure", FIGURE))
            for m in pattern.finditer(comment)]


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def hash_comments(text: str) -> Iterator[tuple[int, str]]:
    """``#`` comments of YAML and Helm templates (a ``#`` that starts a line or follows a space), and Helm's
    ``{{/* */}}`` comments, which may span lines."""
    for number, line in enumerate(text.splitlines(), 1):
        if match := re.search(r"(?:^|\s)(#.*)$", line):
            yield number, match.group(1)
    for match in re.finditer(r"\{\{-?\s*/\*(.*?)\*/\s*-?\}\}", text, re.DOTALL):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def docstrings(text: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and (doc := ast.get_docstring(node, clean=False)) is not None):
            yield getattr(node, "lineno", 1), doc


def checked_files() -> list[Path]:
    files = [p for p in (ROOT / "ragr1").rglob("*.py") if "v1" not in p.relative_to(ROOT).parts]
    files += [p for p in (ROOT / "ragr1").rglob("*.yaml")]
    files += [p for p in (ROOT / "deploy").rglob("*") if p.suffix in {".py", ".yaml", ".yml", ".tpl"}]
    files += sorted(ROOT.glob("docker-compose*.yml"))
    return sorted(set(files))


def comments(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text()
    return python_comments(text) if path.suffix == ".py" else hash_comments(text)


def test_docstrings_carry_no_run_history() -> None:
    """A docstring may explain sizes (a library's own limits, a format's arithmetic), but not when or where a
    run measured something: no dates, no results links."""
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in checked_files() if p.suffix == ".py"
             for line, text in docstrings(p.read_text())
             for what in findings(text) if not what.startswith("measured figure")]
    assert not found, "\n".join(found)


def test_the_check_reads_every_kind_of_file() -> None:
    names = {str(p.relative_to(ROOT)) for p in checked_files()}
    assert {"ragr1/stack/presets/default.yaml", "docker-compose.gpu.yml", "deploy/helm/ragr1/values.yaml",
            "deploy/helm/ragr1/templates/_helpers.tpl", "ragr1/services/trainer/precision.py"} <= names
    assert sum(1 for p in checked_files() for _ in comments(p)) > 1000


def test_comments_say_why_not_what_a_run_measured() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {', '.join(what)}: {text.strip()[:100]}"
             for p in checked_files() for line, text in comments(p) if (what := findings(text))]
    assert not found, "move these to a results page and keep the why:\n" + "\n".join(found)


@pytest.mark.parametrize("comment", [
    "# seed 2, 2026-11-28",
    "# (docs/results/2026-11-28-demo-em-reward.md)",
    "# see results/2026-11-24-trainer-benches.md",
    "# the update takes 42.8 min on two cores",
    "# 4.27 GiB at the defaults",
    "# 12.5% of the groups",
    "# its optimiser steps take x0.74 the time without it",
    "# 1.81× faster with one thread",
    "# 1.81x faster with one thread",
    "# 0.7 gave as many groups in 0.83 of the time",
    "# p99 28.4 ms against 101.2 ms",
    "# 5,115.5 tok/s on an H200",
])
def test_a_date_a_results_link_or_a_measured_figure_is_found(comment: str) -> None:
    assert findings(comment)


@pytest.mark.parametrize("comment", [
    "# Deadline 5 s: a retrieval call takes milliseconds.",
    "# 16 GiB of memory a pod; buckets from 1 ms to 5 min.",
    "# 95% bootstrap intervals over the questions",
    "# vLLM takes 0.7 of the card, not its own 0.9",
    "# temperature 0.7, top-p 1.0; RAG-R1 samples at 1.0",
    "# 120 questions narrow the interval by about sqrt(3)",
    "# x86_64 wheels; TLS 1.3; P-256 keys; version 2.0 of the API",
    "# waits doubling from 1 s to 30 s, 12 x 12 tries",
])
def test_a_setting_or_a_design_bound_is_not_a_figure(comment: str) -> None:
    assert findings(comment) == []


def test_comments_are_found_in_each_syntax() -> None:
    assert list(python_comments("x = 1  # why 2026-11-28\n'# not a comment'\n")) == [(1, "# why 2026-11-28")]
    yaml = "a: 1  # took 42.8 min\nb: '#x'\n{{- /* spans\n  4.27 GiB */ -}}\n"
    assert [findings(text) != [] for _, text in hash_comments(yaml)] == [True, True]
