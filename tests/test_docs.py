"""The docs site builds with no warning (a broken link or anchor fails it), and its generated reference pages
are what their generators write from the code, the chart and the protos now."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragr1 import docgen
from ragr1.docgen import api, helm, metrics, settings


def test_mkdocs_build_strict_passes_with_no_warning(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=docgen.ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()


@pytest.mark.parametrize("page", sorted(docgen.pages()))
def test_generated_page_is_fresh(page: str) -> None:
    on_disk = (docgen.REFERENCE / page).read_text()
    assert on_disk == docgen.pages()[page](), f"docs/reference/{page} is stale: run `make docs`"


def test_every_proto_element_is_commented() -> None:
    missing = api.uncommented()
    assert missing == [], "add a comment above each of these in proto/: " + "; ".join(missing)
    kinds = {e.kind for e in api.elements()}
    assert kinds == {"service", "rpc", "message", "field", "enum", "enum value"}


def test_every_chart_value_is_described_and_has_its_default() -> None:
    found = list(helm.values())
    assert [v.path for v in found if not v.description] == []
    # values.yaml sets every value the schema declares, so the page shows every default.
    leaves = [v for v in found if not any(w.path.startswith(v.path + ".") for w in found)]
    assert [v.path for v in leaves if v.default is helm._MISSING] == []
    assert "retriever.router.replicas" in {v.path for v in found}


def test_metrics_page_lists_every_metric_the_processes_register() -> None:
    from prometheus_client import REGISTRY

    listed = {m.name for m in metrics.metrics()}
    registered = {f.name + ("_total" if f.type == "counter" else "") for f in REGISTRY.collect()
                  if f.name.startswith("ragr1_")}
    assert listed == registered
    assert {m.module for m in metrics.metrics()} <= set(metrics.COMPONENTS)


def test_settings_page_covers_every_command() -> None:
    """Every leaf command of ``ragr1`` is built from a config dataclass, so the page lists all of them."""
    from ragr1.cli import build_parser

    def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> list[tuple[str, ...]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [words]
        return [w for a in subs for name, p in a.choices.items() for w in leaves(p, (*words, name))]

    every = leaves(build_parser(), ())
    documented = [c.words for c in settings.commands()]
    assert sorted(every) == sorted(documented)
    assert {("serve", "rollout-worker"), ("train", "ppo"), ("eval",), ("redis",)} <= set(documented)


# -- the staleness checks see a change in each source --------------------------------------------------
def test_settings_page_changes_with_a_field_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragr1.services.reward.config import RewardConfig

    before = settings.render()
    field = next(f for f in dataclasses.fields(RewardConfig) if f.name == "max_items")
    monkeypatch.setattr(field, "metadata", {"help": "a changed help"})
    after = settings.render()
    assert before != after and "a changed help" in after


def test_metrics_page_changes_with_a_metric_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragr1.services.reward import metrics as reward_metrics

    before = metrics.render()
    monkeypatch.setattr(reward_metrics.REASONS, "_documentation", "A changed help.")
    after = metrics.render()
    assert before != after and "A changed help." in after


def test_helm_page_changes_with_a_schema_description(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    shutil.copy(helm.CHART / "values.yaml", chart / "values.yaml")
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    schema["properties"]["drainSeconds"]["description"] = "A changed description."
    (chart / "values.schema.json").write_text(json.dumps(schema))
    monkeypatch.setattr(helm, "CHART", chart)
    assert "A changed description." in helm.render()
    values = (chart / "values.yaml").read_text()
    (chart / "values.yaml").write_text(values.replace("drainSeconds: 5", "drainSeconds: 7"))
    assert "| `drainSeconds` | number (&gt;= 0) | `7` |" in helm.render()


def test_api_page_changes_with_a_proto_comment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragr1 import protogen

    shutil.copytree(protogen.PROTO_DIR, tmp_path / "proto")
    reward = tmp_path / "proto" / "ragr1" / "v1" / "reward.proto"
    reward.write_text(reward.read_text().replace("// Echoed back; free-form.\n", ""))
    monkeypatch.setattr(api, "PROTO_DIR", tmp_path / "proto")
    monkeypatch.setattr(api, "proto_files", lambda: sorted((tmp_path / "proto" / "ragr1" / "v1").glob("*.proto")))
    assert api.uncommented() == ["field ScoreItem.id (ragr1/v1/reward.proto)"]
    assert api.render() != (docgen.REFERENCE / "api.md").read_text()


def test_every_results_page_is_reached_from_the_results_index() -> None:
    """The sidebar lists the results index alone (mkdocs.yml's not_in_nav): a dated page it does not link
    would be on the site with no way to it."""
    results = Path(__file__).resolve().parent.parent / "docs" / "results"
    index = (results / "index.md").read_text()
    pages = sorted(p.name for p in results.glob("*.md") if p.name != "index.md")
    assert pages, "no results pages"
    assert [p for p in pages if f"]({p})" not in index] == []


def test_the_code_map_names_every_top_level_module_and_folder() -> None:
    """docs/architecture.md's "Where the code lives" names each entry of ragr1/ (a module or a folder)."""
    text = (docgen.ROOT / "docs" / "architecture.md").read_text()
    code_map = text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    package = docgen.ROOT / "ragr1"
    entries = {p.name for p in package.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    missing = {name for name in entries if f"`ragr1/{name}" not in code_map}
    assert not missing, f"docs/architecture.md's code map leaves out {sorted(missing)}"


def _results_links(text: str) -> list[str]:
    return re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]+)?\)", text)


def test_the_current_figures_cite_pages_that_stand() -> None:
    """The results index opens with today's figures; a page a later run superseded is not one of them, and a
    page that says it is superseded names a page that exists."""
    results = docgen.ROOT / "docs" / "results"
    index = (results / "index.md").read_text()
    assert index.startswith("# Results\n\n## Current figures\n")
    current = index.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in current.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and re.fullmatch(r"20\d\d-\d\d-\d\d", cells[4]), row
        (page,) = _results_links(cells[5])
        assert not (results / page).read_text().split("\n", 3)[2].startswith("Superseded by"), row
    for page in results.glob("20*.md"):
        top = page.read_text().split("\n", 3)[2]
        if top.startswith("Superseded by"):
            assert (results / _results_links(top)[0]).exists(), page.name


def test_the_readme_opens_with_the_two_commands_and_carries_no_run_history() -> None:
    """The README is a guide: the two set-up commands first, no dated figures or links to dated pages (the
    figures are the results index's)."""
    text = (docgen.ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert lines[2:6] == ["```bash", lines[3], lines[4], "```"]
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ")
    assert len(lines) < 250
    assert re.findall(r"20\d\d-\d\d-\d\d", text) == []
    assert "docs/results/index.md" in text and "docs/results/20" not in text
