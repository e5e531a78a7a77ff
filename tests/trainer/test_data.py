"""Training data: QA files and Search-R1 parquet in, clear errors on missing fields, SFT trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragr1.protocol.prompts import Mode, question_prompt
from ragr1.services.trainer import data
from ragr1.services.trainer.model import PolicyModel
from ragr1.shipped import SINGLE_HOP, read_jsonl, train_path
from ragr1.v1 import common_pb2
from tests.common import corpus_search
from tests.trainer.rounding import rounding


def test_qa_file_gives_tasks_in_both_modes() -> None:
    multi = data.load_qa_tasks(train_path("hotpotqa"), "multi", limit=5)
    single = data.load_qa_tasks(train_path("hotpotqa"), "single", limit=5)
    assert len(multi) == 5 and all(t.mode == common_pb2.SEARCH_MODE_MULTI for t in multi)
    assert all(t.mode == common_pb2.SEARCH_MODE_SINGLE for t in single)
    assert [t.id for t in multi] == [t.id for t in single]  # stable ids
    assert multi[0].golden_answers and multi[0].supporting_titles and multi[0].data_source == "hotpotqa"
    # HotpotQA's own label, bridge or comparison, is the task's question type.
    assert [t.question_type for t in multi] == [r["type"] for r in read_jsonl(train_path("hotpotqa"), limit=5)]


def test_parquet_round_trip_in_search_r1_layout(tmp_path: Path) -> None:
    tasks = data.load_qa_tasks(train_path("popqa"), "multi", limit=4)
    path = tmp_path / "train.parquet"
    data.write_parquet(tasks, path)
    table = pq.read_table(path)
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(table.column_names)
    row = table.to_pylist()[0]
    assert row["prompt"][0]["role"] == "user" and "<search>" in row["prompt"][0]["content"]
    assert row["reward_model"]["ground_truth"]["target"] == list(tasks[0].golden_answers)
    back = data.read_parquet(path, "single")
    assert [(t.question, list(t.golden_answers)) for t in back] == [
        (t.question, list(t.golden_answers)) for t in tasks
    ]
    assert [t.question_type for t in back] == [t.question_type for t in tasks] == [SINGLE_HOP] * 4


def test_parquet_without_question_column_takes_it_from_the_prompt(tmp_path: Path) -> None:
    prompt = question_prompt("who wrote hamlet?", Mode.SINGLE)
    path = tmp_path / "searchr1.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "nq",
                    "prompt": [{"role": "user", "content": prompt}],
                    "ability": "fact-reasoning",
                    "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
                    "extra_info": {"split": "train", "index": 0},
                }
            ]
        ),
        path,
    )
    (task,) = data.read_parquet(path, "multi")
    assert task.question == "who wrote hamlet?" and list(task.golden_answers) == ["Shakespeare"]


def test_parquet_with_missing_ground_truth_names_file_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    good = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: a?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
    }
    bad = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: b?"}],
        "reward_model": {"style": "rule", "ground_truth": None},
    }
    pq.write_table(pa.Table.from_pylist([good, bad]), path)
    with pytest.raises(ValueError, match=r"bad\.parquet: row 1: missing field 'reward_model.ground_truth'"):
        data.read_parquet(path, "multi")


def test_jsonl_with_missing_answers_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(
        json.dumps({"question": "a?", "golden_answers": ["x"]}) + "\n\n" + json.dumps({"question": "b?"})
    )
    with pytest.raises(ValueError, match=r"qa\.jsonl:3: missing field 'golden_answers'"):
        data.load_tasks(path, "single")


def test_sft_trajectories_mask_exactly_the_information_blocks(tokenizer) -> None:  # type: ignore[no-untyped-def]
    items = corpus_search.named_questions(train_path("hotpotqa"), 3)
    trajectories = corpus_search.trajectories(items, ("single", "multi"), tokenizer, 60)
    assert {t.mode for t in trajectories} == {Mode.SINGLE, Mode.MULTI}
    for t, seq in zip(trajectories, data.tokenize_trajectories(tokenizer, trajectories), strict=True):
        generated = tokenizer.decode([i for i, m in zip(seq.response_ids, seq.loss_mask, strict=True) if m])
        inserted = tokenizer.decode([i for i, m in zip(seq.response_ids, seq.loss_mask, strict=True) if not m])
        assert generated.count("<search>") == t.rounds > 0 and "<information>" not in generated
        assert generated.endswith(tokenizer.eos_token) and "</answer>" in generated
        assert inserted.count("<information>") == t.rounds
        assert tokenizer.decode(seq.prompt_ids).count(t.question) == 1


def test_prepared_trajectories_file_round_trips_and_names_bad_lines(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    items = corpus_search.named_questions(train_path("hotpotqa"), 2)
    trajectories = corpus_search.trajectories(items, ("multi", "none"), tokenizer, 60)
    assert {(t.source, t.question_type) for t in trajectories} == {("hotpotqa", "bridge")}
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(t.to_record()) + "\n" for t in trajectories))
    assert data.is_trajectory_file(path) and data.load_trajectories(path) == trajectories
    path.write_text(json.dumps({"question": "q", "mode": "both", "segments": [{"text": "x", "generated": True}]}))
    with pytest.raises(ValueError, match=r"sft\.jsonl:1: field 'mode': unknown search mode 'both'"):
        data.load_trajectories(path)


def trajectory_file(path: Path, tokenizer, questions: int) -> str:  # type: ignore[no-untyped-def]
    """A trajectories file as ``ragr1 data prepare`` writes it, of the first HotpotQA questions."""
    items = corpus_search.named_questions(train_path("hotpotqa"), questions)
    trajectories = corpus_search.trajectories(items, ("single", "multi"), tokenizer, 120)
    assert trajectories
    path.write_text("".join(json.dumps(t.to_record()) + "\n" for t in trajectories))
    return str(path)


def test_sft_step_lowers_the_loss_on_its_batch(tiny_model_dir: Path, tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    from ragr1.services.trainer.config import SFTConfig
    from ragr1.services.trainer.sft import SFTTrainer

    config = SFTConfig(
        model=str(tiny_model_dir),
        output_dir=str(tmp_path),
        train_files=[trajectory_file(tmp_path / "sft.jsonl", tokenizer, 1)],
        top_k=1,
        tokens_per_query=40,
        lr=3e-3,
        bf16=False,
        batch_size=4,
        epochs=3,
    )
    trainer = SFTTrainer(config, PolicyModel(tiny_model_dir, bf16=False))
    losses: list[float] = []
    path = trainer.train(on_step=lambda s: losses.append(s["loss"]))
    assert losses[-1] < losses[0]
    assert (path / "config.json").exists() and (path / "model.safetensors").exists()
    reloaded = PolicyModel(path, bf16=False)
    for name, value in trainer.model.lm.state_dict().items():
        assert value.equal(reloaded.lm.state_dict()[name]), name
    assert (tmp_path / "sft_steps.jsonl").exists() and (tmp_path / "sft_curves.png").exists()


def test_an_sft_steps_loss_and_gradient_do_not_depend_on_its_micro_batches(  # type: ignore[no-untyped-def]
        tiny_model_dir: Path, tmp_path: Path, tokenizer) -> None:
    """The step sums its micro-batches' losses on the device and reads them once: one micro-batch per sequence
    reports the loss and gradient norm of the whole batch in one pass (token-weighted over the batch)."""
    from ragr1.services.trainer.config import SFTConfig
    from ragr1.services.trainer.sft import SFTTrainer

    vocabulary = 0
    prepared = trajectory_file(tmp_path / "sft.jsonl", tokenizer, 4)

    def step(micro_batch_size: int) -> dict[str, float]:
        nonlocal vocabulary
        config = SFTConfig(model=str(tiny_model_dir), output_dir=str(tmp_path), train_files=[prepared], top_k=1,
                           tokens_per_query=40, bf16=False, batch_size=4, micro_batch_size=micro_batch_size)
        trainer = SFTTrainer(config, PolicyModel(tiny_model_dir, bf16=False))
        vocabulary = trainer.model.base().config.vocab_size
        sequences = trainer.build_sequences()[:4]
        assert len(sequences) == 4
        return trainer.step(sequences)

    whole, split = step(4), step(1)
    assert whole["tokens"] == split["tokens"] > 0
    # The same sums in other orders (tests/trainer/rounding.py): the loss is a mean of log-probs, of its own size.
    assert abs(whole["loss"] - split["loss"]) <= rounding(vocabulary, whole["loss"]) and whole["loss"] > 0
    assert abs(whole["grad_norm"] - split["grad_norm"]) <= rounding(vocabulary, whole["grad_norm"])
