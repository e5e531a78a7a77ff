"""`ragr1 demo --preset quick` end to end: every service starts, SFT and RL go through the real services and
Redis, weights advance stage by stage, the report holds every stage with intervals and baselines, and no
process outlives the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragr1.services.common.redis_server import free_port
from ragr1.stack.supervisor import port_in_use
from tests.e2e.processes import processes_using_ports

pytestmark = pytest.mark.e2e  # make test-e2e


def test_quick_demo_trains_through_the_queue_and_cleans_up(tmp_path: Path) -> None:
    base = free_port() // 100 * 100  # a block of ports away from the defaults
    run_dir = tmp_path / "run"
    result = subprocess.run(
        # The quick preset, smaller still (flags override a preset): this is the longest end-to-end test. On the
        # default's PopQA question a few-question SFT model answers without searching; on these multi-hop ones
        # it searches, so the retriever's latency is in the report. SFT keeps only the trajectories whose search
        # showed an answer: three questions a source leave it some to learn searching from, one may leave none.
        [sys.executable, "-m", "ragr1", "demo", "--preset", "quick", "--eval-questions", "1",
         "--train-questions", "3", "--sources", "hotpotqa,musique", "--base-port", str(base),
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    endpoints = json.loads((run_dir / "endpoints.json").read_text())
    services = set(endpoints["services"])
    assert {"retriever-shard-0", "retriever-shard-1", "retriever", "reward", "policy", "trainer"} <= services

    report = json.loads((run_dir / "report.json").read_text())
    # Each stage's numbers with what they depend on: one corpus and retriever for all, each stage's own weights.
    provenances = [s["provenance"] for s in report["stages"]]
    assert report["provenance"] == provenances[-1] and report["gains_refused"] == []
    assert len({json.dumps([p["corpus"], p["retriever"]], sort_keys=True) for p in provenances}) == 1
    assert len(provenances[0]["corpus"]["sha256"]) == 64 and provenances[0]["retriever"]["top_k"] == 3
    assert len({p["checkpoint"]["sha256"] for p in provenances}) == 3
    assert all(p["seed"]["engine"] == 0 and p["code_commit"]["policy"] for p in provenances)
    # Base is version 0, SFT was pushed as version 1, then one RL update through the queue published 2.
    assert [(s["stage"], s["policy_version"]) for s in report["stages"]] == [("base", 0), ("sft", 1), ("rl", 2)]
    assert [s["version"] for s in report["rl_steps"]] == [2]
    step = report["rl_steps"][0]
    assert step["announced"]["version"] == 2 and len(step["announced"]["sha256"]) == 64, step
    assert isinstance(step["reward_total"], float) and isinstance(step["kl"], float)
    assert 0.0 <= step["signal_f1"] <= 1.0  # the share of GRPO groups the reward can teach from
    # RL prompts are questions neither SFT nor evaluation saw.
    files = {name: Path(report["questions"][f"{name}_file"]) for name in ("eval", "train", "rl", "gain")}
    ids = {name: {json.loads(line)["id"] for line in path.read_text().splitlines()} for name, path in files.items()}
    assert ids["rl"] and not ids["rl"] & (ids["train"] | ids["eval"])
    sources = report["config"]["sources"]
    # The more held-out questions (the quick preset's one a source): no stage saw them; SFT and RL answered
    # them in the mode RL trains, and their gain is paired question by question.
    assert len(ids["gain"]) == len(sources) and not ids["gain"] & (ids["rl"] | ids["train"] | ids["eval"])
    held_out = report["held_out_gain"]
    assert (held_out["from"], held_out["to"], held_out["questions"]) == ("sft", "rl", len(sources))
    assert held_out["exact_match"]["gain"]["n"] == len(sources)
    assert {stage: {r["mode"] for r in records} for stage, records in report["gain_rollouts"].items()} == {
        "sft": {held_out["mode"]}, "rl": {held_out["mode"]}}
    for stage in report["stages"]:
        rows = stage["summaries"]
        # Every source on its own, in every mode, with an interval around each mean.
        wanted = {(s, m) for s in sources for m in ("none", "single", "multi")}
        assert {(r["benchmark"], r["mode"]) for r in rows} == wanted
        for row in rows:
            assert row["questions"] == 1
            low, high = row["exact_match_ci"]
            assert low <= row["exact_match"] <= high
            assert isinstance(row["seconds_per_question"], float)
        records = report["rollouts"][stage["stage"]]
        assert {r["policy_version"] for r in records} == {stage["policy_version"]}
        assert all(r["retrieval_rounds"] == 0 for r in records if r["mode"] == "none")
    assert [b["source"] for b in report["baselines"]] == sources
    assert {(g["from"], g["to"]) for g in report["gains"]} == {("base", "sft"), ("sft", "rl")}
    assert {g["source"] for g in report["gains"]} == {*sources, "all"}
    assert all(g["exact_match"]["n"] == len(sources) for g in report["gains"] if g["source"] == "all")
    assert report["sft_steps"] and all(s["loss"] > 0 for s in report["sft_steps"])
    rounds = sum(r["retrieval_rounds"] for records in report["rollouts"].values() for r in records)
    assert rounds > 0 and report["latency"]["retriever"]["Search"]["calls"] > 0
    for plot in report["plots"].values():
        assert Path(plot).stat().st_size > 1000
    for heading in ("held-out questions", "RL training batches (em reward), per update",
                    "GRPO groups whose samples differ", "paired gains", "more held-out questions"):
        assert heading in result.stdout, result.stdout[-3000:]

    ports = [int(s["grpc"].rsplit(":", 1)[1]) for s in endpoints["services"].values()]
    ports.append(int(endpoints["redis"].rsplit(":", 1)[1].split("/")[0]))
    assert processes_using_ports(ports) == []
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
