"""Training-health alarms: the likelihood change of the reinforced rollouts measured after the update, and
a real update loop (Redis, the PPO updater on the tiny SmolLM2-shaped model) driven into each alarm's
condition, seen in the log, the step record and the metrics."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import torch
from prometheus_client import REGISTRY

from ragr1.services.trainer.config import HealthSettings, PPOConfig
from ragr1.services.trainer.health import ALARMS, HealthMonitor, thresholds
from ragr1.services.trainer.loop.ppo_loop import PPOLoop, to_sample
from ragr1.services.trainer.model import collate
from ragr1.services.trainer.updater import PPOUpdater
from ragr1.v1 import common_pb2
from tests.trainer.rollouts import make_loop, make_rollout, produce, tiny_settings
from tests.trainer.rounding import rounding

LOGGER = "ragr1.services.trainer.loop"


def test_the_monitor_counts_falling_updates_in_a_row_and_fires_on_each_threshold() -> None:
    monitor = HealthMonitor(HealthSettings(likelihood_falling_updates=2, entropy_floor=0.5, kl_ceiling=0.2))
    names = []
    for change in (-0.1, -0.2, None, -0.3, 0.1, -0.1):
        record: dict[str, float] = {"entropy": 1.0, "kl": 0.1}
        if change is not None:
            record["likelihood_change"] = change
        names.append(([f.alarm.name for f in monitor.check(record)], record["likelihood_falling_updates"]))
    # An update that reinforced nothing (no change measured) neither breaks nor extends the run.
    assert names == [([], 1), (["likelihood_falling"], 2), (["likelihood_falling"], 2),
                     (["likelihood_falling"], 3), ([], 0), ([], 1)]
    fired = monitor.check({"entropy": 0.4, "kl": 0.3, "logprob_gap": 0.2})
    assert [(f.alarm.name, f.value, f.threshold) for f in fired] == [
        ("entropy_low", 0.4, 0.5), ("kl_high", 0.3, 0.2), ("weight_sync", 0.2, 0.1)]
    # At the threshold exactly: not below the floor, not above the ceiling.
    assert monitor.check({"entropy": 0.5, "kl": 0.2, "logprob_gap": 0.1}) == []
    # A value that is not a number is a broken model: every alarm that watches one fires.
    nan = float("nan")
    broken = {"likelihood_change": nan, "entropy": nan, "kl": nan, "logprob_gap": nan}
    assert [f.alarm.name for f in monitor.check(broken)] == [a.name for a in ALARMS]


def test_every_alarm_that_is_on_has_its_threshold_and_a_counter_series_from_the_start() -> None:
    HealthMonitor(HealthSettings()).export_metrics()
    for alarm in ALARMS:
        assert REGISTRY.get_sample_value("ragr1_trainer_alarm_threshold", {"alarm": alarm.name}) is not None
        # A labelled counter has no series until a label is used: the dashboard's panel would say "no data".
        assert REGISTRY.get_sample_value("ragr1_trainer_health_alarms_total", {"alarm": alarm.name}) is not None


def test_a_zero_threshold_turns_its_alarm_off_and_the_settings_refuse_bad_ones() -> None:
    off = HealthSettings(likelihood_falling_updates=0, entropy_floor=0.0, kl_ceiling=0.0)
    assert thresholds(off) == {"weight_sync": 0.1}
    assert [f.alarm.name for f in HealthMonitor(off).check(
        {"likelihood_change": -1.0, "entropy": 0.0, "kl": 99.0})] == []
    assert set(thresholds(HealthSettings())) == {a.name for a in ALARMS}
    for change, message in [({"entropy_floor": -0.1}, "entropy_floor must be at least 0"),
                            ({"kl_ceiling": -1.0}, "kl_ceiling must be at least 0"),
                            ({"likelihood_falling_updates": -1}, "likelihood_falling_updates must be at least 0"),
                            ({"logprob_gap_threshold": 0.0}, "logprob_gap_threshold must be positive")]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(PPOConfig(), **change)  # type: ignore[arg-type]


def test_the_likelihood_change_is_what_the_update_did_to_the_rollouts_it_reinforced(tiny_model_dir: Path) -> None:
    """Recomputed from outside: the reinforced rows' log-probs after the update minus before it."""
    updater = PPOUpdater.build(tiny_settings(advantage="grpo", actor_lr=5e-3, kl_coef=0.0, mini_batch_size=4),
                               tiny_model_dir)
    samples = []
    for i, score in enumerate((1.0, 0.0, 0.0, 1.0)):
        sample = to_sample(make_rollout(f"r{i}", score=score, seed=i, group=f"g{i // 2}"))
        sample.behaviour_logprobs = None
        samples.append(sample)
    before = updater.prepare(samples)
    stats = updater.update(samples)
    batch = collate([s.sequence for s in samples], updater.actor.pad_id)
    updater.actor.eval()
    with torch.no_grad():
        after = updater.actor(batch).logprobs
    reinforced = [0, 3]
    mask = batch.mask[reinforced]
    expected = float(((after[reinforced] - before.old_logprobs[reinforced]) * mask).sum() / mask.sum())
    assert stats["likelihood_rollouts"] == 2
    # A mean of differences of log-probs computed in other micro-batches: the log-probs' rounding, not its own.
    scale = float((after[reinforced].abs() * mask).max())
    assert abs(stats["likelihood_change"] - expected) <= rounding(updater.actor.base().config.vocab_size, scale)
    assert stats["likelihood_change"] > 0  # an ordinary update raises what it reinforces
    assert 0 < stats["likelihood_check_seconds"] < stats["update_seconds"]


# -- a real update loop driven into each alarm's condition -----------------------------------------
Batch = Callable[[int, int], list[common_pb2.Rollout]]  # (update, version) -> the rollouts to train on


def like(template: common_pb2.Rollout, rollout_id: str, group: str, score: float, version: int) -> common_pb2.Rollout:
    """The same prompt and response as ``template``, as another sample of another group."""
    rollout = common_pb2.Rollout()
    rollout.CopyFrom(template)
    rollout.id, rollout.task_id, rollout.group_id, rollout.policy_version = rollout_id, group, group, version
    rollout.reward.total = rollout.reward.exact_match = score
    return rollout


PAIRS = [make_rollout(f"p{i}", prompt_len=6, generated=3, inserted=2) for i in range(6)]
X = make_rollout("x", prompt_len=6, generated=20, inserted=0)


def groups(update: int, version: int) -> list[common_pb2.Rollout]:
    """Three groups of two, one member right and one wrong; the same responses at every update."""
    return [like(r, f"u{update}-{i}", f"u{update}-g{i // 2}", float(i % 2), version) for i, r in enumerate(PAIRS)]


def displacing(update: int, version: int) -> list[common_pb2.Rollout]:
    """One response right in one group and wrong in two others (a noisy reward, or near-duplicate
    responses): the update means to raise its likelihood in the first, and lowers it on balance."""
    short = {"prompt_len": 6, "generated": 1, "inserted": 0}
    return [
        like(X, f"u{update}-xa", f"u{update}-a", 1.0, version),
        make_rollout(f"u{update}-y", version, score=0.0, group=f"u{update}-a", **short),
        like(X, f"u{update}-xb", f"u{update}-b", 0.0, version),
        make_rollout(f"u{update}-z", version, score=1.0, group=f"u{update}-b", **short),
        like(X, f"u{update}-xc", f"u{update}-c", 0.0, version),
        make_rollout(f"u{update}-w", version, score=1.0, group=f"u{update}-c", **short),
    ]


def control(update: int, version: int) -> list[common_pb2.Rollout]:
    """The same shapes and scores as ``displacing``, with three different long responses."""
    rollouts = displacing(update, version)
    rollouts[0].reward.extracted_answer = "Paris, Texas"
    for i in (2, 4):
        other = make_rollout(f"other{i}", prompt_len=6, generated=20, inserted=0)
        rollouts[i].prompt_token_ids[:] = other.prompt_token_ids
        rollouts[i].response_token_ids[:] = other.response_token_ids
    return rollouts


def synced(updater: PPOUpdater, rollouts: list[common_pb2.Rollout]) -> list[common_pb2.Rollout]:
    """Behaviour log-probs of the trainer's current weights: what a policy in step with it records."""
    samples = [to_sample(r) for r in rollouts]
    batch = collate([s.sequence for s in samples], updater.actor.pad_id, [s.temperature for s in samples])
    updater.actor.eval()
    with torch.no_grad():
        logprobs = updater.actor(batch).logprobs
    for i, rollout in enumerate(rollouts):
        rollout.behaviour_logprobs[:] = logprobs[i, : len(rollout.response_token_ids)].tolist()
    return rollouts


def drive(loop: PPOLoop, client: redis.Redis, batch: Batch, updates: int, sync: bool = True) -> list[dict[str, object]]:
    updater = loop.updater
    assert isinstance(updater, PPOUpdater)
    loop.rollouts.ensure_group()
    loop.prompts.ensure_group()
    for update in range(updates):
        rollouts = batch(update, loop.version)
        produce(client, synced(updater, rollouts) if sync else rollouts)
        loop.collect()
        loop.train_batch()
    return loop.steps.read()


@dataclasses.dataclass
class Case:
    batch: Batch
    updates: int
    lr: float
    health: HealthSettings = dataclasses.field(default_factory=HealthSettings)
    kl_coef: float = 0.0
    sync: bool = True
    mini_batch_size: int = 6


CASES = {
    # Defaults but for the cause: the three thresholds below are the shipped ones.
    "likelihood_falling": Case(displacing, 3, lr=5e-3),
    # A learning rate far too high: the policy turns deterministic on what it was shown.
    "entropy_low": Case(groups, 2, lr=1.0, mini_batch_size=2),
    # A tiny ceiling: the first update starts at the reference (KL 0), the second has left it.
    "kl_high": Case(groups, 2, lr=5e-2, health=HealthSettings(kl_ceiling=1e-4), kl_coef=0.001),
    # Behaviour log-probs of other weights than the trainer's (make_rollout's are random).
    "weight_sync": Case(groups, 1, lr=5e-3, sync=False),
}


@pytest.mark.parametrize("alarm", list(CASES))
def test_a_real_update_loop_driven_into_each_condition_logs_the_alarm_with_its_update(
    alarm: str, redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[alarm]
    torch.manual_seed(0)
    settings = tiny_settings(
        advantage="grpo", actor_lr=case.lr, kl_coef=case.kl_coef, mini_batch_size=case.mini_batch_size
    )
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, PPOUpdater.build(settings, tiny_model_dir),
                     batch_size=6, samples_per_prompt=2, max_updates=0, **dataclasses.asdict(case.health))
    threshold = getattr(case.health, next(a.threshold for a in ALARMS if a.name == alarm))
    assert REGISTRY.get_sample_value("ragr1_trainer_alarm_threshold", {"alarm": alarm}) == threshold
    # A series from the start (0 until the alarm first fires), so the dashboard's panel has data.
    counted = REGISTRY.get_sample_value("ragr1_trainer_health_alarms_total", {"alarm": alarm})
    assert counted is not None
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = drive(loop, redis_client, case.batch, case.updates, case.sync)
    fired = [r["version"] for r in records if alarm in r["alarms"]]  # type: ignore[operator]
    print(alarm, [{k: r.get(k) for k in ("version", "alarms", "likelihood_change", "entropy", "kl", "logprob_gap",
                                         "update_seconds", "save_seconds", "queue_seconds")}
                  for r in records])
    assert fired, f"{alarm} never fired"
    assert records[0]["alarms"] == [] or alarm == "weight_sync", "an alarm fired before its cause"
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    for version in fired:
        assert any(m.startswith(f"training-health alarm {alarm} at update {version}:") for m in messages), messages
    assert REGISTRY.get_sample_value("ragr1_trainer_health_alarms_total", {"alarm": alarm}) == counted + len(fired)
    if alarm == "likelihood_falling":
        assert fired == [3]  # three falls in a row, the shipped likelihood_falling_updates
        assert all(float(r["likelihood_change"]) < 0 for r in records)  # type: ignore[arg-type]
        assert REGISTRY.get_sample_value("ragr1_trainer_likelihood_falling_updates") == 3
        assert REGISTRY.get_sample_value("ragr1_trainer_likelihood_change_nats") == records[-1]["likelihood_change"]
    if alarm == "entropy_low":
        assert fired == [2] and float(records[0]["entropy"]) > 1.0  # type: ignore[arg-type]
        assert REGISTRY.get_sample_value("ragr1_trainer_entropy_nats") == records[-1]["entropy"]
    if alarm == "kl_high":
        assert fired == [2]


def test_the_same_loop_without_the_displacement_raises_the_reinforced_likelihood(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    settings = tiny_settings(advantage="grpo", actor_lr=5e-3, kl_coef=0.0, mini_batch_size=6)
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, PPOUpdater.build(settings, tiny_model_dir),
                     batch_size=6, samples_per_prompt=2, max_updates=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = drive(loop, redis_client, control, 3)
    assert all(float(r["likelihood_change"]) > 0 for r in records), records  # type: ignore[arg-type]
    assert [r["alarms"] for r in records] == [[], [], []]
    assert not [r for r in caplog.records if "training-health alarm" in r.getMessage()]
    # The lengths the record and the metrics carry: three long responses of 40 tokens, three of 2.
    last = records[-1]
    assert (last["response_length"], last["response_length_max"]) == (pytest.approx(21.0), 40)
    assert last["generated_length"] == last["response_length"]  # nothing inserted here
    assert last["answer_length"] == pytest.approx(2 / 6)  # one answer of two words among six rollouts
    assert REGISTRY.get_sample_value("ragr1_trainer_response_length_tokens", {"stat": "max"}) == 40
    assert REGISTRY.get_sample_value("ragr1_trainer_answer_length_words") == pytest.approx(2 / 6)
