"""Intervals and baselines of the demo's table: bootstrap, paired gains, the best constant answer."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ragr1.shipped import read_jsonl, train_path
from ragr1.stack import stats
from ragr1.stack.demo import DemoConfig
from ragr1.stack.gains import StageResult, held_out_gain, stage_gains
from ragr1.stack.questions import split_questions


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_questions() -> None:
    rng = random.Random(0)
    small = [float(rng.random() < 0.3) for _ in range(20)]
    large = [float(rng.random() < 0.3) for _ in range(400)]
    s, big = stats.bootstrap(small), stats.bootstrap(large)
    assert s.low <= s.mean <= s.high and big.low <= big.mean <= big.high
    assert (big.high - big.low) < (s.high - s.low) / 3
    # A binomial proportion's 95% interval at n=400, p~0.3 is about +-0.045.
    assert 0.07 < big.high - big.low < 0.11
    assert stats.bootstrap([1.0] * 10) == stats.Estimate(1.0, 1.0, 1.0, 10)


def test_paired_gain_sees_what_two_overlapping_intervals_hide() -> None:
    rng = random.Random(1)
    before = [float(rng.random() < 0.3) for _ in range(60)]
    after = [1.0 if b else float(rng.random() < 0.2) for b in before]  # only ever gains
    a, b = stats.bootstrap(after), stats.bootstrap(before)
    assert a.low < b.high  # the marginal intervals overlap ...
    gain = stats.paired_difference(after, before)
    assert gain.excludes_zero() and gain.mean == pytest.approx(a.mean - b.mean)  # ... the paired one does not
    with pytest.raises(ValueError, match="differ in size"):
        stats.paired_difference([1.0], [1.0, 0.0])


def test_best_constant_is_the_most_frequent_answer_and_scores_what_it_should() -> None:
    golds = [["Politician"], ["politician", "statesman"], ["actor"], ["The Politician"], ["journalist"]]
    best = stats.best_constant(golds)
    assert best.answer == "politician"
    assert best.exact_match.mean == pytest.approx(3 / 5)


def test_demo_questions_leave_no_room_for_a_constant() -> None:
    sources = [*DemoConfig().sources, "musique"]
    split = split_questions(40, 0, sources=sources)
    assert not any(stats.is_yes_no(r["golden_answers"]) for r in split.eval)
    for source in sources:
        golds = [r["golden_answers"] for r in split.eval if r["dataset"] == source]
        assert len(golds) == 40 and stats.best_constant(golds).exact_match.mean <= 0.05
    # PopQA's occupation questions, which the demo used once, let one word score a quarter of them.
    popqa = [r["golden_answers"] for r in read_jsonl(train_path("popqa"), limit=40)]
    assert stats.best_constant(popqa).exact_match.mean >= 0.2


SAME_INDEX = {"corpus": {"sha256": "c" * 64, "passages": 40}, "retriever": {"encoder": "e", "index_type": "flat",
                                                                           "top_k": 3}}


def test_the_demo_pools_paired_gains_over_its_sources() -> None:
    def records(stage: str, hotpot: list[float], musique: list[float]) -> StageResult:
        rows = [{"data_source": source, "mode": "single", "question": f"{source} q{i}", "exact_match": score,
                 "f1": score} for source, scores in (("hotpotqa", hotpot), ("musique", musique))
                for i, score in enumerate(scores)]
        # Listed musique first and in reverse, as a stage's records need not come in one order; both stages
        # evaluated under one corpus and retriever, as the demo pairs only such stages.
        return StageResult(stage, 1, [], rows[::-1], 0.0, SAME_INDEX)

    stages = [records("sft", [0, 0], [1, 0]), records("rl", [1, 1], [1, 0])]
    single = {g["source"]: g for g in stage_gains(stages, ["hotpotqa", "musique"]) if g["mode"] == "single"}
    assert single["hotpotqa"]["exact_match"]["mean"] == 1.0 and single["musique"]["exact_match"]["mean"] == 0.0
    pooled = single["all"]["exact_match"]
    assert pooled["n"] == 4 and pooled["mean"] == 0.5  # paired question by question across both sources


def test_the_demo_pairs_sft_and_rl_on_the_more_held_out_questions_alone() -> None:
    def records(scores: list[float], mode: str = "multi") -> list[dict[str, object]]:
        return [{"data_source": ("hotpotqa", "musique")[i % 2], "mode": mode, "question": f"q{i}",
                 "exact_match": score, "f1": score} for i, score in enumerate(scores)]

    def stage(name: str, every_mode: float, more: list[float]) -> StageResult:
        # The more held-out records listed in reverse: a stage's records need not come in one order.
        return StageResult(name, 1, [], records([every_mode] * 2, "single"), 0.0, SAME_INDEX,
                           gain_records=records(more)[::-1])

    stages = [stage("base", 0.0, []), stage("sft", 0.0, [0, 0, 1, 0, 1, 0]), stage("rl", 1.0, [1, 0, 1, 1, 1, 0])]
    held_out = held_out_gain(stages, "multi")
    assert held_out is not None
    assert (held_out["from"], held_out["to"], held_out["mode"], held_out["questions"]) == ("sft", "rl", "multi", 6)
    em = held_out["exact_match"]
    assert (em["sft"]["mean"], em["rl"]["mean"]) == (pytest.approx(2 / 6), pytest.approx(4 / 6))
    # Paired question by question, every difference is 0 or 1, so no resample's mean is below 0 (misaligned,
    # some would be -1).
    assert em["gain"]["n"] == 6 and em["gain"]["mean"] == pytest.approx(2 / 6) and em["gain"]["low"] >= 0
    # The every-mode gains never count the more held-out questions.
    assert max(g["exact_match"]["n"] for g in stage_gains(stages, ["hotpotqa", "musique"])) == 2
    # None where SFT and RL were evaluated under different retrievers, or without the more held-out questions.
    other = {**SAME_INDEX, "retriever": {**SAME_INDEX["retriever"], "top_k": 5}}
    assert held_out_gain([*stages[:2], dataclasses.replace(stages[2], provenance=other)], "multi") is None
    assert held_out_gain([stage("sft", 0.0, []), stage("rl", 1.0, [])], "multi") is None
