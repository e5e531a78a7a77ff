"""The pieces under `ragr1 eval` and `ragr1 demo`: loading questions, summing up rollouts, quantiles,
splitting questions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ragr1.shipped import EVAL_BENCHMARKS
from ragr1.stack import evaluate
from ragr1.stack.questions import split_questions
from ragr1.stack.report import quantile
from ragr1.v1 import common_pb2


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
