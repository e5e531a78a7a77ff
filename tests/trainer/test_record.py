"""Each update's step record, from the rollouts it trained and what the update returned: rewards, group
signal, the mean reward of all that was sampled, staleness, lengths, and what the update cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragr1.services.trainer.loop.groups import type_label
from ragr1.services.trainer.loop.record import groups_by_type, lengths, signal_share, step_record
from ragr1.v1 import common_pb2
from tests.trainer.rollouts import make_rollout


def test_signal_share_counts_the_groups_whose_scores_differ() -> None:
    assert signal_share([1, 0, 1, 1, 0, 0], ["a", "a", "b", "b", "c", "c"]) == pytest.approx(1 / 3)
    assert signal_share([0.5, 0.5, 1.0], ["a", "a", "b"]) == 0.0  # b, a group of one, compares nothing
    with pytest.raises(ValueError, match="no group"):
        signal_share([1.0, 0.0], ["a", "b"])


def test_lengths_count_response_generated_tokens_and_answer_words() -> None:
    # 2 x 3 generated tokens around 4 inserted ones; 2 x 1 generated around none.
    long = make_rollout("long", generated=3, inserted=4)
    long.reward.extracted_answer = "Paris, Texas"
    short = make_rollout("short", generated=1, inserted=0)
    assert lengths([long, short]) == {
        "response_length": (10 + 2) / 2,
        "response_length_max": 10.0,
        "generated_length": (6 + 2) / 2,
        "answer_length": (2 + 0) / 2,
    }


def scored(rollout_id: str, group: str, total: float, exact: float, f1: float) -> common_pb2.Rollout:
    rollout = make_rollout(rollout_id, group=group)
    rollout.reward.CopyFrom(common_pb2.RewardParts(total=total, exact_match=exact, f1=f1, format=0.5))
    return rollout


def record(tmp_path: Path, groups: list[str] | None) -> dict[str, object]:
    checkpoint = tmp_path / "policy"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 1000)
    (checkpoint / "config.json").write_text("{}")
    batch = [scored("a1", "A", 1.0, 1.0, 1.0), scored("a2", "A", 0.0, 0.0, 0.5),
             scored("b1", "B", 1.0, 1.0, 0.8), scored("b2", "B", 1.0, 1.0, 0.6)]
    return step_record(
        7,
        batch,
        {"policy_loss": 0.25, "update_seconds": 3.0},
        groups=groups,
        staleness=[0, 1, 1, 2],
        skipped=[[0.0, 0.0], [1.0, 1.0]],
        skipped_types=["popqa/single-hop", "hotpotqa/bridge"],
        queue_seconds=1.0,
        checkpoint=checkpoint,
        save_seconds=0.5,
        announced={"version": 7, "sha256": "ab12"},
    )


def test_the_step_record_of_an_update(tmp_path: Path) -> None:
    r = record(tmp_path, ["A", "A", "B", "B"])
    assert (r["step"], r["version"], r["rollout_ids"]) == (7, 7, ["a1", "a2", "b1", "b2"])
    assert r["policy_loss"] == 0.25 and r["update_seconds"] == 3.0  # the updater's statistics, as they came
    assert r["reward_total"] == r["reward_exact_match"] == 0.75
    assert r["reward_f1"] == pytest.approx(0.725) and r["reward_format"] == 0.5 and r["reward_process"] == 0.0
    # A's totals differ and B's do not; in f1 both groups' do.
    assert (r["signal_total"], r["signal_exact_match"], r["signal_f1"]) == (0.5, 0.5, 1.0)
    # The batch holds only groups with a spread; the sampled mean keeps the two groups skipped for it.
    assert r["groups_skipped_uniform"] == 2 and r["rollouts_sampled"] == 8
    assert (r["groups_trained"], r["groups_sampled"]) == (2, 4)
    assert r["reward_sampled"] == pytest.approx((3.0 + 2.0) / 8)
    assert (r["staleness_mean"], r["staleness_max"]) == (1.0, 2)
    assert r["queue_seconds"] == 1.0 and r["queue_share"] == pytest.approx(1.0 / (1.0 + 3.0))
    assert r["checkpoint"] == str(tmp_path / "policy") and r["weights_bytes"] == 1002
    assert (r["save_seconds"], r["announced"]) == (0.5, {"version": 7, "sha256": "ab12"})
    assert r["response_length"] == 17.0 and r["answer_length"] == 0.0


def test_with_one_sample_per_prompt_the_record_has_no_group_signal(tmp_path: Path) -> None:
    r = record(tmp_path, None)
    assert not [key for key in r if key.startswith("signal_")]
    assert r["reward_total"] == 0.75


def test_an_update_counts_its_groups_by_source_and_question_type(tmp_path: Path) -> None:
    kinds = {"A": ("hotpotqa", "comparison"), "B": ("popqa", "single-hop"), "C": ("hotpotqa", "comparison"),
             "D": ("hotpotqa", "")}
    batch = [make_rollout(f"{group.lower()}{i}", group=group, source=source, question_type=kind)
             for group, (source, kind) in kinds.items() for i in (1, 2)]
    groups = [r.group_id for r in batch]
    expected: dict[str, int] = {}
    for source, kind in kinds.values():
        label = f"{source}/{kind or '?'}"
        expected[label] = expected.get(label, 0) + 1
    assert groups_by_type(batch, groups) == expected == {"hotpotqa/?": 1, "hotpotqa/comparison": 2,
                                                         "popqa/single-hop": 1}
    # One sample per prompt: every rollout a group of its own.
    assert groups_by_type(batch, None) == {label: 2 * n for label, n in expected.items()}
    assert type_label(common_pb2.Rollout()) == "?/?"
    checkpoint = tmp_path / "policy"
    checkpoint.mkdir()
    skipped = [make_rollout("u1", source="popqa", question_type="single-hop"),
               make_rollout("v1", source="hotpotqa", question_type="bridge"),
               make_rollout("w1", source="popqa", question_type="single-hop")]
    r = step_record(3, batch, {}, groups=groups, staleness=[0] * len(batch), skipped=[[0.0, 0.0]] * 3,
                    skipped_types=[type_label(s) for s in skipped], queue_seconds=1.0, checkpoint=checkpoint,
                    save_seconds=0.1, announced={})
    assert r["trained_groups"] == expected and sum(r["trained_groups"].values()) == r["groups_trained"]
    assert r["skipped_groups"] == {"hotpotqa/bridge": 1, "popqa/single-hop": 2}
    assert sum(r["skipped_groups"].values()) == r["groups_skipped_uniform"]
    assert json.loads(json.dumps(r["trained_groups"])) == r["trained_groups"]  # steps.jsonl takes it as it is
