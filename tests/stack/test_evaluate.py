"""The pieces under `ragr1 eval` and `ragr1 demo`: loading questions, summing up rollouts, quantiles,
splitting questions."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import subprocess
from pathlib import Path

import pytest

from ragr1.services.common.provenance import code_commit
from ragr1.shipped import BRIDGE, COMPARISON, EVAL_BENCHMARKS, SINGLE_HOP
from ragr1.stack import evaluate, stats
from ragr1.stack.demo import demo_config
from ragr1.stack.gains import (
    StageResult,
    mode_differences,
    mode_lines,
    refused_gains,
    stage_gains,
    type_rows,
    type_table,
)
from ragr1.stack.questions import _usable, split_questions, write_jsonl
from ragr1.stack.report import quantile
from ragr1.v1 import common_pb2, policy_pb2, retriever_pb2


def test_every_benchmark_loads_and_bad_files_name_line_and_field(tmp_path: Path) -> None:
    for name in EVAL_BENCHMARKS:
        questions = evaluate.load_questions(name, limit=3)
        assert len(questions) == 3 and all(q.question and q.golden_answers for q in questions)
    bad = tmp_path / "mine.jsonl"
    bad.write_text(json.dumps({"question": "Who?", "golden_answers": ["x"]}) + "\n" + json.dumps({"question": "Q"}))
    with pytest.raises(ValueError, match=r"mine.jsonl:2: field 'golden_answers'"):
        evaluate.load_questions(bad)
    with pytest.raises(FileNotFoundError, match="benchmarks: nq"):
        evaluate.load_questions(tmp_path / "missing.jsonl")


def test_summary_means_and_rates() -> None:
    def rollout(em: float, fmt: float, rounds: int, status: int) -> common_pb2.Rollout:
        return common_pb2.Rollout(reward=common_pb2.RewardParts(exact_match=em, f1=em / 2, format=fmt),
                                  retrieval_rounds=rounds, num_queries=2 * rounds, status=status)  # type: ignore[arg-type]

    rollouts = [rollout(1, 1.0, 2, common_pb2.TRAJECTORY_STATUS_ANSWERED),
                rollout(0, 0.5, 1, common_pb2.TRAJECTORY_STATUS_RETRIEVAL_ERROR)]
    s = evaluate.summarise("nq", "multi", rollouts, wall_seconds=3.0)
    assert (s.exact_match, s.f1, s.format_valid, s.answered) == (0.5, 0.25, 0.5, 0.5)
    assert (s.retrieval_rounds, s.queries, s.seconds_per_question, s.errors) == (1.5, 3.0, 1.5, 1)


def test_quantile_interpolates_inside_buckets_as_promql_does() -> None:
    buckets = [(0.1, 0.0), (0.2, 50.0), (0.4, 100.0), (math.inf, 100.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.2)
    assert quantile(buckets, 0.75) == pytest.approx(0.3)
    assert math.isnan(quantile([(math.inf, 0.0)], 0.5))


def test_split_keeps_evaluation_questions_out_of_training() -> None:
    split = split_questions(3, 5, rl_per_source=2)
    assert len(split.eval) == 6 and len(split.train) == 10 and len(split.rl) == 4
    ids = [{r["id"] for r in part} for part in (split.eval, split.train, split.rl)]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
    # RL prompts alternate between the sources, so that a two-prompt update sees both.
    assert [r["dataset"] for r in split.rl] == ["hotpotqa", "musique", "hotpotqa", "musique"]
    gold = {p["pid"] for r in split.eval for p in r["paragraphs"] if p["is_supporting"]}
    assert gold <= split.passage_ids()
    narrow = split_questions(1, 1, allowed=split.passage_ids())
    assert {r["id"] for r in narrow.eval} <= {r["id"] for r in split.eval + split.train}
    with pytest.raises(ValueError, match="only"):
        split_questions(3, 5, allowed=set())


def test_the_more_held_out_questions_come_after_rl_s_and_leave_the_rest_of_the_split_as_it_was() -> None:
    without = split_questions(3, 5, rl_per_source=2, rl_sources=["popqa", "hotpotqa"])
    split = split_questions(3, 5, rl_per_source=2, rl_sources=["popqa", "hotpotqa"], gain_per_source=4)
    for part in ("eval", "train", "rl"):
        assert [r["id"] for r in getattr(split, part)] == [r["id"] for r in getattr(without, part)], part
    # From the evaluated sources only, each source's next questions after the ones RL takes from it.
    assert [r["dataset"] for r in split.gain] == ["hotpotqa"] * 4 + ["musique"] * 4
    longer = split_questions(3, 5, rl_per_source=2 + 4, rl_sources=["popqa", "hotpotqa"])
    hotpot_after_rl = [r["id"] for r in longer.rl if r["dataset"] == "hotpotqa"][2:]
    assert [r["id"] for r in split.gain if r["dataset"] == "hotpotqa"] == hotpot_after_rl
    seen = {r["id"] for r in split.eval + split.train + split.rl}
    assert len({r["id"] for r in split.gain}) == 8 and not {r["id"] for r in split.gain} & seen
    assert {p["pid"] for r in split.gain for p in r["paragraphs"]} <= split.passage_ids()
    with pytest.raises(ValueError, match=r"\+ 4 \(more held-out\)"):
        split_questions(3, 5, allowed={p["pid"] for r in split.eval + split.train for p in r["paragraphs"]},
                        gain_per_source=4)


def test_rl_may_draw_on_other_sources_without_constant_prone_questions() -> None:
    split = split_questions(3, 5, rl_per_source=4, rl_sources=["popqa", "hotpotqa"])
    assert [r["dataset"] for r in split.eval] == ["hotpotqa"] * 3 + ["musique"] * 3  # evaluation unchanged
    assert [r["dataset"] for r in split.rl] == ["hotpotqa", "popqa"] * 4
    # PopQA's occupation questions are left out: "politician" would be paid without a search.
    assert all(r["type"] != "occupation" for r in split.rl if r["dataset"] == "popqa")
    alone = split_questions(3, 5, rl_per_source=4)
    hotpot_rl = [r["id"] for r in split.rl if r["dataset"] == "hotpotqa"]
    assert hotpot_rl == [r["id"] for r in alone.rl if r["dataset"] == "hotpotqa"]  # after SFT's, as before
    assert not {r["id"] for r in split.rl} & {r["id"] for r in split.eval + split.train}


def test_modes_of_the_eval_command() -> None:
    assert evaluate.parse_modes("both") == ["single", "multi"]
    assert evaluate.parse_modes("all") == ["none", "single", "multi"]
    assert evaluate.parse_modes("none,multi") == ["none", "multi"]
    with pytest.raises(ValueError, match="--mode 'many'"):
        evaluate.parse_modes("many")


def test_each_source_is_summed_up_on_its_own() -> None:
    def rollout(source: str, em: float) -> common_pb2.Rollout:
        return common_pb2.Rollout(data_source=source, reward=common_pb2.RewardParts(exact_match=em, f1=em))

    rollouts = [rollout("hotpotqa", 1), rollout("musique", 0), rollout("hotpotqa", 0), rollout("musique", 0)]
    hotpot, musique = evaluate.summarise_sources("multi", rollouts, wall_seconds=8.0)
    assert (hotpot.benchmark, hotpot.questions, hotpot.exact_match) == ("hotpotqa", 2, 0.5)
    assert (musique.benchmark, musique.exact_match, musique.exact_match_ci) == ("musique", 0.0, (0.0, 0.0))
    assert hotpot.exact_match_ci[0] <= 0.5 <= hotpot.exact_match_ci[1]
    assert hotpot.seconds_per_question == musique.seconds_per_question == 2.0


def _info(corpus: str = "c" * 64, top_k: int = 3, encoder: str = "all-MiniLM-L6-v2") -> policy_pb2.PolicyInfoResponse:
    return policy_pb2.PolicyInfoResponse(
        weight_version=1, checkpoint_path="/ckpt/v1", checkpoint_sha256="a" * 64, top_k=top_k, max_turns=4,
        max_queries_per_search=3, query_separator=",", engine_seed=7, code_commit="abc123",
        default_sampling=common_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=256),
        retriever=retriever_pb2.InfoResponse(encoder=encoder, index_type="flat", num_passages=300, num_shards=2,
                                             corpus_sha256=corpus, manifest_sha256="m" * 64),
    )


def test_an_evaluation_records_what_its_numbers_depend_on() -> None:
    rollouts = [common_pb2.Rollout(sampling=common_pb2.SamplingParams(top_p=1.0, max_tokens=64)) for _ in range(3)]
    p = evaluate.provenance(_info(), rollouts)
    assert p["corpus"] == {"sha256": "c" * 64, "passages": 300}
    assert (p["retriever"]["encoder"], p["retriever"]["index_type"], p["retriever"]["top_k"]) == (
        "all-MiniLM-L6-v2", "flat", 3)
    assert (p["checkpoint"]["sha256"], p["checkpoint"]["weight_version"]) == ("a" * 64, 1)
    # Greedy evaluation: one sampling setting for every rollout, as they carry it.
    assert p["sampling"] == [{"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": 0, "stop": []}]
    assert p["seed"] == {"engine": 7, "requests": [0]}
    assert p["code_commit"]["policy"] == "abc123" and p["code_commit"]["evaluation"]
    json.dumps(p)  # it goes into the JSON reports as it is
    assert evaluate.incomparable(p, evaluate.provenance(_info(), [])) == ""
    assert "corpus sha256 differs" in evaluate.incomparable(p, evaluate.provenance(_info(corpus="d" * 64)))
    assert "retriever top_k differs: 3 against 5" in evaluate.incomparable(p, evaluate.provenance(_info(top_k=5)))
    assert "retriever encoder unknown" in evaluate.incomparable(p, evaluate.provenance(_info(encoder="")))


def test_the_demo_pairs_only_stages_evaluated_under_the_same_corpus_and_retriever() -> None:
    def stage(name: str, em: float, info: policy_pb2.PolicyInfoResponse) -> StageResult:
        records = [{"data_source": "hotpotqa", "mode": "multi", "question": f"q{i}", "exact_match": em, "f1": em}
                   for i in range(4)]
        return StageResult(name, 0, [], records, 1.0, evaluate.provenance(info))

    stages = [stage("base", 0.0, _info()), stage("sft", 1.0, _info()), stage("rl", 1.0, _info(corpus="d" * 64))]
    paired = stage_gains(stages, ["hotpotqa"])
    assert {(g["from"], g["to"]) for g in paired} == {("base", "sft")}
    (refused,) = refused_gains(stages)
    assert (refused["from"], refused["to"]) == ("sft", "rl") and "corpus sha256 differs" in refused["reason"]
    assert all(g["exact_match"]["mean"] == 1.0 for g in paired if g["mode"] == "multi")


def test_the_code_commit_is_the_checkout_s_and_unknown_elsewhere(tmp_path: Path) -> None:
    assert code_commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert code_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_commit(tmp_path) == head + "-dirty"
    # A folder inside someone else's checkout (a package installed in a project's tree) is not that code.
    (tmp_path / "site").mkdir()
    assert code_commit(tmp_path / "site") == "unknown"


def test_the_modes_go_out_in_one_sequence_of_full_batches_and_come_back_per_mode_in_question_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    questions = [
        evaluate.Question(id=f"q{i}", question=f"question {i}?", golden_answers=["a"], data_source="popqa")
        for i in range(40)
    ]
    calls: list[list[str]] = []

    def rollout(tasks: list[common_pb2.PromptTask]) -> list[common_pb2.Rollout]:
        calls.append([t.id for t in tasks])
        # Answered out of order, as a policy may finish them.
        return [common_pb2.Rollout(id=f"r-{t.id}", task_id=t.id, mode=t.mode) for t in reversed(tasks)]

    # A clock that moves one second a reading: every batch takes one second.
    clock = iter(range(1000))
    monkeypatch.setattr(evaluate.time, "perf_counter", lambda: float(next(clock)))
    done: list[int] = []
    by_mode = evaluate.run_questions(rollout, questions, ["none", "single", "multi"], batch_size=32, run="sft",
                                     progress=done.append)
    # 120 tasks in batches of 32: no mode ends on a short batch of its own (32 + 8 three times before).
    assert [len(c) for c in calls] == [32, 32, 32, 24] and sum(done) == 120
    assert list(by_mode) == ["none", "single", "multi"]
    for mode, (rollouts, _) in by_mode.items():
        assert [r.task_id for r in rollouts] == [f"sft:{mode}:q{i}" for i in range(40)]
        assert all(r.mode == evaluate.MODES[mode] for r in rollouts)
    # A mode's share of a batch's second is its share of the batch's questions: none has all of the first batch
    # and 8/32 of the second, single 24/32 and 16/32, multi 16/32 and all of the last.
    assert {mode: seconds for mode, (_, seconds) in by_mode.items()} == {"none": 1.25, "single": 1.25, "multi": 1.5}
    # A mode named twice runs once.
    twice = evaluate.run_questions(rollout, questions[:2], ["multi", "multi"])
    assert list(twice) == ["multi"] and len(twice["multi"][0]) == 2
    with pytest.raises(ValueError, match=r"'both'"):
        evaluate.run_questions(rollout, questions, ["multi", "both"])
    with pytest.raises(ValueError, match=r"unique.*q0"):
        evaluate.run_questions(rollout, questions + questions[:1], ["multi"])
    with pytest.raises(ValueError, match=r"no rollout for 1 of 40 tasks"):
        evaluate.run_questions(lambda tasks: rollout(tasks)[1:], questions, ["multi"], batch_size=40)


def test_the_demo_holds_out_hotpotqa_bridge_and_comparison_questions_alike(tmp_path: Path) -> None:
    c = demo_config()
    sizes = {"sources": c.sources, "rl_per_source": c.rl_questions, "rl_sources": c.rl_sources or None,
             "gain_per_source": c.gain_questions}
    split = split_questions(c.eval_questions, c.train_questions, balance_types=c.balance_types, **sizes)
    in_order = split_questions(c.eval_questions, c.train_questions, balance_types=False, **sizes)
    held_out = collections.Counter(r["question_type"] for r in split.eval if r["dataset"] == "hotpotqa")
    assert set(held_out) == {BRIDGE, COMPARISON} and abs(held_out[BRIDGE] - held_out[COMPARISON]) <= 1
    assert not any(stats.is_yes_no(r["golden_answers"]) for r in split.eval + split.gain)
    # In file order the comparison questions, most of them yes/no and left out, would be fewer.
    assert sum(r["question_type"] == COMPARISON for r in in_order.eval) < held_out[COMPARISON]
    # Each type's questions keep their file order: the held-out ones of a type are its first usable ones.
    usable = list(_usable("hotpotqa", None))
    for kind, n in held_out.items():
        first = [r["id"] for r in usable if r["question_type"] == kind][:n]
        assert [r["id"] for r in split.eval if r["dataset"] == "hotpotqa" and r["question_type"] == kind] == first
    assert {r["question_type"] for r in split.eval if r["dataset"] == "popqa"} == {SINGLE_HOP}
    # A file of one type (MuSiQue's chains) splits as in file order.
    assert [r["id"] for r in split_questions(3, 5, sources=("musique",)).eval] == [
        r["id"] for r in split_questions(3, 5, sources=("musique",), balance_types=False).eval]
    # The question file the demo writes carries the type, and the questions read back from it.
    questions = evaluate.load_questions(write_jsonl(split.eval, tmp_path / "eval.jsonl"))
    assert [q.question_type for q in questions] == [r["question_type"] for r in split.eval]


def test_an_evaluation_record_carries_the_question_type_and_the_trajectory_s_seconds() -> None:
    question = evaluate.Question("q1", "Who is older, A or B?", ["A"], "hotpotqa", question_type=COMPARISON)
    task = evaluate.to_task(question, "multi")
    assert (task.question_type, task.data_source) == (COMPARISON, "hotpotqa")
    rollout = common_pb2.Rollout(task_id=task.id, question_type=task.question_type, mode=task.mode,
                                 generation_seconds=1.25, retrieval_seconds=0.5, retrieval_rounds=1, num_queries=2)
    record = evaluate.rollout_record(rollout)
    assert (record["question_type"], record["seconds"], record["mode"]) == (COMPARISON, 1.75, "multi")


def _record(mode: str, kind: str, em: float, rounds: int, queries: int, seconds: float) -> dict[str, object]:
    rollout = common_pb2.Rollout(
        question=f"{mode} {kind} {em} {rounds} {queries} {seconds}", data_source="hotpotqa", question_type=kind,
        mode=evaluate.MODES[mode], retrieval_rounds=rounds, num_queries=queries, generation_seconds=seconds,
        retrieval_seconds=seconds / 4, reward=common_pb2.RewardParts(exact_match=em, f1=em),
    )
    return {"stage": "sft", **evaluate.rollout_record(rollout)}


def test_the_report_by_stage_mode_and_question_type() -> None:
    # (mode, type, EM, rounds, queries, generation seconds) per question; the retrieval seconds are a quarter more.
    rows = [("multi", COMPARISON, 1, 1, 2, 2.0), ("multi", COMPARISON, 0, 1, 3, 4.0),
            ("multi", COMPARISON, 1, 2, 2, 2.0), ("single", COMPARISON, 1, 2, 2, 8.0), ("single", BRIDGE, 0, 3, 3, 4.0),
            ("multi", BRIDGE, 0, 0, 0, 1.0), ("none", SINGLE_HOP, 0, 0, 0, 0.4), ("multi", "", 1, 1, 1, 1.0)]
    records = [_record(*row) for row in rows]
    more = [_record("multi", BRIDGE, 1, 2, 4, 2.0)]
    table = type_rows([StageResult("sft", 1, [], records, 0.0, gain_records=more)])
    assert [(r["stage"], r["mode"], r["question_type"]) for r in table] == [
        ("sft", "none", SINGLE_HOP), ("sft", "single", BRIDGE), ("sft", "single", COMPARISON),
        ("sft", "multi", BRIDGE), ("sft", "multi", COMPARISON), ("sft", "multi", "unknown"),
        ("sft (more)", "multi", BRIDGE)]
    for row in table:
        mine = [r for mode, kind, *r in rows if (mode, kind or "unknown") == (row["mode"], row["question_type"])]
        if row["stage"].endswith("(more)"):
            mine = [[1, 2, 4, 2.0]]
        ems, rounds, queries, seconds = zip(*mine, strict=True)
        assert row["questions"] == len(mine)
        assert row["exact_match"] == dataclasses.asdict(stats.bootstrap([float(e) for e in ems]))
        assert row["retrieval_rounds"] == pytest.approx(sum(rounds) / len(mine))
        assert row["queries_per_round"] == (pytest.approx(sum(queries) / sum(rounds)) if sum(rounds) else None)
        assert row["seconds_per_question"] == pytest.approx(1.25 * sum(seconds) / len(mine))
    comparison = table[4]
    assert (comparison["questions"], comparison["retrieval_rounds"], comparison["queries_per_round"]) == (
        3, pytest.approx(4 / 3), pytest.approx(7 / 4))
    assert comparison["exact_match"]["low"] < comparison["exact_match"]["mean"] < comparison["exact_match"]["high"]
    json.dumps(table)  # it goes into report.json as it is
    lines = type_table(table).splitlines()
    assert len(lines) == 2 + len(table) and "queries/round" in lines[0]
    assert lines[2].split()[:3] == ["sft", "none", SINGLE_HOP] and lines[2].split()[-2] == "-"  # no round: no ratio
    assert str(stats.Estimate(**comparison["exact_match"])) in lines[6]


def test_multi_against_single_query_mode_paired_question_by_question_per_type() -> None:
    # question -> type, (rounds, EM) in single-query mode, (rounds, EM) in multi-query mode
    questions = {"q1": (COMPARISON, (2, 1), (1, 1)), "q2": (COMPARISON, (2, 0), (1, 1)),
                 "q3": (BRIDGE, (2, 1), (2, 0)), "q4": (SINGLE_HOP, (1, 1), (1, 1))}
    records = []
    for question, (kind, *by_mode) in questions.items():
        for mode, (rounds, em) in zip(("single", "multi"), by_mode, strict=True):
            rollout = common_pb2.Rollout(question=question, data_source="hotpotqa", question_type=kind,
                                         mode=evaluate.MODES[mode], retrieval_rounds=rounds, num_queries=rounds,
                                         reward=common_pb2.RewardParts(exact_match=em))
            records.append(evaluate.rollout_record(rollout))
    only_multi = [r for r in records if r["mode"] == "multi"]
    rows = mode_differences([StageResult("sft", 1, [], records, 0.0), StageResult("rl", 2, [], only_multi, 0.0)])
    assert [r["questions"] for r in rows] == ["all", "multi-hop", SINGLE_HOP, BRIDGE, COMPARISON]  # no rl rows
    for row in rows:
        mine = [q for q, (kind, *_) in questions.items()
                if row["questions"] in ("all", kind) or (row["questions"] == "multi-hop" and kind != SINGLE_HOP)]
        assert row["n"] == len(mine)
        for key, at in (("retrieval_rounds", 0), ("exact_match", 1)):
            single = [float(questions[q][1][at]) for q in sorted(mine)]
            multi = [float(questions[q][2][at]) for q in sorted(mine)]
            assert row[key]["single"] == pytest.approx(sum(single) / len(mine))
            assert row[key]["multi"] == pytest.approx(sum(multi) / len(mine))
            assert row[key]["difference"] == dataclasses.asdict(stats.paired_difference(multi, single))
    comparison = rows[-1]
    assert comparison["retrieval_rounds"]["difference"]["mean"] == -1.0  # one round fewer on each
    assert comparison["exact_match"]["difference"]["mean"] == 0.5
    json.dumps(rows)
    assert len(mode_lines(rows).splitlines()) == len(rows) and "multi - single" in mode_lines(rows)
