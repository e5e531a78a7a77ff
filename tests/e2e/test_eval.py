"""`ragr1 up` (two policy replicas) and `ragr1 eval` on a few questions of every benchmark, with EM and F1
recomputed here independently of the reward service; then `ragr1 up` SIGKILLed, and nothing of its stack
left behind."""

from __future__ import annotations

import json
import re
import signal
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from ragr1.model_paths import prepare_policy_model
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.provenance import code_commit
from ragr1.services.common.redis_server import free_port
from ragr1.shipped import EVAL_BENCHMARKS
from ragr1.stack.supervisor import port_in_use
from tests.common.waiting import wait_for

pytestmark = pytest.mark.e2e  # make test-e2e


def normalise(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1(prediction: str, gold: str) -> float:
    p, g = normalise(prediction).split(), normalise(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def last_answer(response: str) -> str:
    found = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return found[-1].strip() if found else ""


def port_of(address: str) -> int:
    """``127.0.0.1:50051``, ``http://127.0.0.1:51051/metrics`` or ``redis://127.0.0.1:6379/0`` -> the port."""
    return int(address.rsplit(":", 1)[1].split("/")[0])


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_eval_through_the_running_stack(tmp_path: Path) -> None:
    base = free_port() // 100 * 100
    run_dir = tmp_path / "run"
    up = subprocess.Popen(
        [sys.executable, "-m", "ragr1", "up", "--no-trainer", "--index-passages", "300", "--base-port", str(base),
         "--run-dir", str(run_dir), "--max-turns", "2", "--max-tokens-per-turn", "64", "--policy-replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert up.stdout is not None
        lines = []
        for line in up.stdout:
            lines.append(line)
            if "the stack is up" in line:
                break
        assert up.poll() is None, "".join(lines[-40:])
        out = tmp_path / "eval.json"
        result = subprocess.run(
            [sys.executable, "-m", "ragr1", "eval", "--endpoints", str(run_dir / "endpoints.json"),
             "--benchmarks", ",".join(EVAL_BENCHMARKS), "--limit", "2", "--mode", "multi", "--out", str(out)],
            capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        # Every process of the stack, vLLM's engine processes included, and every port it listens on.
        stack = [child.pid for child in psutil.Process(up.pid).children(recursive=True)]
        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        assert [name for name in endpoints["services"] if name.startswith("policy")] == ["policy", "policy-1"]
        ports = [port_of(endpoints["redis"])] + [
            port_of(address) for s in endpoints["services"].values() for address in (s["grpc"], s["metrics"])
        ]
    finally:
        # Killed as the kernel's OOM killer would: nothing of the stack may outlive it, or the next `ragr1 up`
        # finds its ports taken.
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=60)

    def left() -> list[int]:
        return [pid for pid in stack if alive(pid)] + [port for port in ports if port_in_use("127.0.0.1", port)]

    wait_for(lambda: not left(), lambda: f"after `ragr1 up` was killed, still running or held: {left()}", 10, 0.2)

    report = json.loads(out.read_text())
    assert [s["benchmark"] for s in report["summaries"]] == list(EVAL_BENCHMARKS)
    # What makes the numbers comparable: the 300 passages indexed, the retriever, the served weights' hash
    # (SmolLM2 as shipped), greedy sampling as the rollouts carry it, the seeds and the code's commit.
    p = report["provenance"]
    assert p["corpus"]["passages"] == 300 and len(p["corpus"]["sha256"]) == 64
    assert (p["retriever"]["encoder"], p["retriever"]["index_type"], p["retriever"]["top_k"]) == (
        "all-MiniLM-L6-v2", "flat", 3)
    assert p["checkpoint"]["sha256"] == checkpoint_sha256(prepare_policy_model())
    assert [s["temperature"] for s in p["sampling"]] == [0.0] and p["seed"]["engine"] == 0
    assert p["code_commit"]["policy"] == p["code_commit"]["evaluation"] == code_commit()
    rows = report["questions"]
    assert len(rows) == 2 * len(EVAL_BENCHMARKS)
    for row in rows:
        # The answer is read from what the model generated: the system's feedback (which quotes the
        # tags) is left out. An untrained model may copy the feedback it was shown, so count: every
        # inserted copy is in the response and none of them is in what it generated.
        feedback = INVALID_ACTION_FEEDBACK.strip()
        if feedback in row["response"]:
            assert row["generated"].count(feedback) < row["response"].count(feedback)
        answer = last_answer(row["generated"])
        assert row["answer"] == answer
        em = float(any(normalise(answer) == normalise(g) for g in row["golden_answers"])) if answer else 0.0
        best_f1 = max(f1(answer, g) for g in row["golden_answers"]) if answer else 0.0
        assert row["exact_match"] == em, row
        assert abs(row["f1"] - best_f1) < 1e-9, row
    for summary in report["summaries"]:
        mine = [r for r in rows if r["benchmark"] == summary["benchmark"]]
        assert summary["questions"] == 2
        assert abs(summary["exact_match"] - sum(r["exact_match"] for r in mine) / 2) < 1e-9
        assert abs(summary["f1"] - sum(r["f1"] for r in mine) / 2) < 1e-9
        assert abs(summary["retrieval_rounds"] - sum(r["retrieval_rounds"] for r in mine) / 2) < 1e-9
