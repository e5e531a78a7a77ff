"""The PPO loop on a real Redis, its parts together: bad input, staleness, whole groups, de-duplication,
the weight-sync alarm, a bounded Redis, restarts. Each part alone: test_admission, test_groups, test_record,
test_gauges."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import redis
import torch
from prometheus_client import REGISTRY

from ragr1.services.common import fleet
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, WORKERS, StreamQueue
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir, size_bytes
from ragr1.services.trainer.config import NO_SIGNAL_EXIT_CODE
from ragr1.services.trainer.loop.ppo_loop import NoSignal, PPOLoop, check_rollout, to_sample
from ragr1.services.trainer.model import collate
from ragr1.services.trainer.publisher import WeightPublisher
from ragr1.services.trainer.steplog import StepLog
from ragr1.services.trainer.updater import PPOUpdater
from ragr1.v1 import common_pb2
from tests.common.waiting import wait_for
from tests.trainer.command import ROOT, child_env, run_train_ppo, train_ppo
from tests.trainer.rollouts import make_loop, make_rollout, produce, tiny_config


def test_check_rollout_names_the_problem() -> None:
    good = make_rollout("r")
    assert check_rollout(good, 0) is None
    short = make_rollout("r")
    del short.loss_mask[-1]
    assert "lengths disagree" in (check_rollout(short, 0) or "")
    assert "from the future" in (check_rollout(make_rollout("r", version=3), 2) or "")
    assert "sampled greedily (temperature 0)" in (check_rollout(make_rollout("r", temperature=0.0), 0) or "")
    unknown = make_rollout("r")
    unknown.ClearField("sampling")
    assert "no sampling settings" in (check_rollout(unknown, 0) or "")


def test_bad_stale_and_duplicate_rollouts_are_handled_and_training_goes_on(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=4, max_updates=2, max_staleness=0)
    bad = make_rollout("bad-lengths")
    del bad.behaviour_logprobs[-1]
    batch1 = [make_rollout(f"a{i}") for i in range(4)]
    produce(redis_client, [*batch1, bad, make_rollout("from-future", version=5), make_rollout("a0")])
    loop.rollouts.ensure_group()
    loop.prompts.ensure_group()
    loop.resume()
    loop.collect()
    loop.train_batch()  # version 1
    # Version-0 rollouts are now stale (S = 0); version-1 ones train.
    produce(
        redis_client, [make_rollout("old", version=0)] + [make_rollout(f"b{i}", version=1) for i in range(4)]
    )
    loop.run()
    assert loop.version == 2
    dead = {d["id"]: d["reason"] for d in loop.rollouts.dead_letters()}
    assert set(dead) == {"bad-lengths", "from-future"}
    assert "lengths disagree" in dead["bad-lengths"] and "future" in dead["from-future"]
    assert loop.status.rollouts_dropped_stale == 1
    ids = [i for record in loop.steps.read() for i in record["rollout_ids"]]
    assert sorted(ids) == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)])
    assert loop.rollouts.pending() == 0
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_duplicate_does_not_mark_its_untrained_original_done(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=4)
    loop.rollouts.ensure_group()
    produce(redis_client, [make_rollout("a0"), make_rollout("a1"), make_rollout("a0")])  # a0 delivered twice
    loop._admit(loop.rollouts.consume(10))
    assert [d.message.id for d in loop.groups.buffered] == ["a0", "a1"]
    assert not loop.rollouts.is_done("a0")  # the copy is acknowledged, the original still waits
    # The trainer dies before a0 is trained; its successor re-reads its pending entries and keeps a0.
    successor = make_loop(redis_client, tiny_model_dir, tmp_path / "successor", batch_size=4)
    successor._admit(successor.rollouts.consume(10, pending=True))
    assert [d.message.id for d in successor.groups.buffered] == ["a0", "a1"]


def test_a_trainer_under_a_new_name_trains_what_its_predecessor_left_pending(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    predecessor = make_loop(redis_client, tiny_model_dir, tmp_path / "old", consumer="trainer-old")
    predecessor.rollouts.ensure_group()
    produce(redis_client, [make_rollout(f"r{i}") for i in range(4)])
    assert len(predecessor.rollouts.consume(10)) == 4  # delivered, then the pod is gone before training
    successor = make_loop(redis_client, tiny_model_dir, tmp_path / "new", consumer="trainer-new", max_updates=1)
    deadline = threading.Timer(60, successor.stop_event.set)  # without the take-over it would wait for good
    deadline.start()
    successor.run()
    deadline.cancel()
    assert [sorted(r["rollout_ids"]) for r in successor.steps.read()] == [["r0", "r1", "r2", "r3"]]
    assert successor.rollouts.pending() == 0


def test_batches_hold_whole_groups_and_a_group_is_dropped_whole(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The policy serves the starting weights as version 1; S = 1, so version 0 is stale after one update.
    loop = make_loop(
        redis_client, tiny_model_dir, tmp_path, batch_size=4, max_updates=2, max_staleness=1, samples_per_prompt=2,
        start_version=1,
    )
    produce(
        redis_client,
        [
            make_rollout("a1", 1, group="A"), make_rollout("b1", 1, group="B"), make_rollout("a2", 1, group="A"),
            # C has a member sampled greedily (dead-lettered): its other member is dropped, never trained.
            make_rollout("c1", 1, group="C"), make_rollout("c2", 1, group="C", temperature=0.0),
            make_rollout("d1", 1, group="D"), make_rollout("d2", 1, group="D", score=0.0),
        ],
    )
    loop.rollouts.ensure_group()
    loop.prompts.ensure_group()
    loop.collect()
    first = loop.train_batch()  # version 2; B is still arriving and waits
    assert sorted(first["rollout_ids"]) == ["a1", "a2", "d1", "d2"]
    # A's samples scored alike (nothing to learn), D's differ: half the groups carry a signal.
    assert first["signal_total"] == first["signal_exact_match"] == 0.5 and first["signal_f1"] == 0.0
    # B's second member arrives; E has one member two versions behind (S = 1): E is dropped whole.
    produce(
        redis_client,
        [make_rollout("e1", 2, group="E"), make_rollout("b2", 2, group="B"),
         make_rollout("e2", 0, group="E"), make_rollout("f1", 2, group="F"),
         make_rollout("f2", 2, group="F")],
    )
    loop.run()
    records = loop.steps.read()
    assert [sorted(r["rollout_ids"]) for r in records] == [["a1", "a2", "d1", "d2"], ["b1", "b2", "f1", "f2"]]
    assert loop.version == 3
    assert loop.status.rollouts_dropped_stale == 2  # e1 (fresh) went with its stale group-mate e2
    assert [d["id"] for d in loop.rollouts.dead_letters()] == ["c2"]
    assert loop.rollouts.pending() == 0  # c1, e1 and e2 were settled without training


def test_dynamic_sampling_trains_only_groups_whose_scores_differ_and_stops_when_its_bound_finds_none(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=4, samples_per_prompt=2, max_uniform_groups=3)
    skipped_before = REGISTRY.get_sample_value("ragr1_trainer_rollouts_total", {"outcome": "uniform_group"}) or 0.0
    produce(
        redis_client,
        [
            *(make_rollout(f"a{i}", group="A", source="hotpotqa", question_type="comparison")
              for i in (1, 2)),  # both 1: nothing to learn
            *(make_rollout(f"d{i}", group="D", score=i - 1.0, source="popqa", question_type="single-hop")
              for i in (1, 2)),
            make_rollout("g1", group="G", score=0.0), make_rollout("g2", group="G", score=0.0),
            *(make_rollout(f"h{i}", group="H", score=(i - 1) / 2, source="hotpotqa", question_type="bridge")
              for i in (1, 2)),
        ],
    )
    loop.rollouts.ensure_group()
    loop.prompts.ensure_group()
    assert loop.collect()
    first = loop.train_batch()
    # A and G are skipped (two of the bound's three); the batch is D and H, both with a spread.
    assert sorted(first["rollout_ids"]) == ["d1", "d2", "h1", "h2"] and first["signal_total"] == 1.0
    assert (first["groups_trained"], first["groups_skipped_uniform"], first["groups_sampled"]) == (2, 2, 4)
    # Which sources and question types it trained, and which it skipped (G's rollouts carry neither).
    assert first["trained_groups"] == {"hotpotqa/bridge": 1, "popqa/single-hop": 1}
    assert first["skipped_groups"] == {"?/?": 1, "hotpotqa/comparison": 1}
    # The trained batch's mean leaves the skipped groups out; the sampled mean (the learning curve) keeps them.
    assert first["reward_total"] == pytest.approx(1.5 / 4)
    assert first["reward_sampled"] == pytest.approx(3.5 / 8) and first["rollouts_sampled"] == 8
    assert all(loop.rollouts.is_done(i) for i in ("a1", "a2", "g1", "g2"))  # settled, not left pending
    after = REGISTRY.get_sample_value("ragr1_trainer_rollouts_total", {"outcome": "uniform_group"})
    assert after == skipped_before + 4
    # The bound is per update. Here it is reached with one group with a spread: the update trains that one.
    produce(redis_client, [make_rollout("k1", group="K"), make_rollout("k2", group="K"),
                           make_rollout("m1", group="M", score=0.0), make_rollout("m2", group="M", score=1.0),
                           make_rollout("n1", group="N", score=0.0), make_rollout("n2", group="N", score=0.0),
                           make_rollout("r1", group="R", score=0.0), make_rollout("r2", group="R", score=0.0)])
    assert loop.collect()
    second = loop.train_batch()
    assert sorted(second["rollout_ids"]) == ["m1", "m2"]
    assert (second["groups_trained"], second["groups_skipped_uniform"], second["groups_sampled"]) == (1, 3, 4)
    assert sum(second["skipped_groups"].values()) == 3  # this update's skips only
    assert loop.version == 2
    # Reached with none: training stops and says why, and nothing uniform was trained.
    produce(redis_client, [make_rollout(f"{g.lower()}{i}", 2, group=g, score=score)
                           for g, score in (("P", 1.0), ("Q", 0.0), ("S", 0.5)) for i in (1, 2)])
    with pytest.raises(NoSignal, match=r"all 3 groups sampled for update 3 scored alike.*max_uniform_groups \(now 3\)"):
        loop.collect()
    assert loop.version == 2 and loop.rollouts.pending() == 0


def test_weight_sync_alarm_fires_when_the_behaviour_log_probs_are_not_the_trainers(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=2, max_updates=3, max_staleness=1)
    updater = loop.updater
    assert isinstance(updater, PPOUpdater)

    def trainer_logprobs(rollout: common_pb2.Rollout) -> list[float]:
        sample = to_sample(rollout)
        batch = collate([sample.sequence], updater.actor.pad_id, [sample.temperature])
        with torch.no_grad():
            return updater.actor(batch).logprobs[0].tolist()  # type: ignore[no-any-return]

    def matching(rollout_id: str, version: int) -> common_pb2.Rollout:
        """A rollout whose behaviour log-probs are the trainer's own now: what a synced policy records."""
        rollout = make_rollout(rollout_id, version)
        rollout.behaviour_logprobs[:] = trainer_logprobs(rollout)
        return rollout

    # Sampled by the version-0 weights, trained only after version 1: what overlapping rollouts are.
    late = matching("late", 0)
    produce(redis_client, [matching("ok1", 0), matching("ok2", 0)])
    loop.rollouts.ensure_group()
    loop.prompts.ensure_group()
    loop.collect()
    synced = loop.train_batch()
    assert synced["logprob_gap"] < 1e-4 and synced["weight_sync_alarm"] is False
    # The tiny model's first update barely moves it; move it far, as a real update can.
    with torch.no_grad():
        for param in updater.actor.actor_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    moved = [abs(a - b) for a, b, m in zip(trainer_logprobs(late), late.behaviour_logprobs, late.loss_mask,
                                           strict=True) if m]
    assert sum(moved) / len(moved) > 0.1  # compared with the current weights, "late" would alarm

    # A rollout one version behind is checked under the weights before the last update, beside one of
    # the current version: both match.
    produce(redis_client, [late, matching("now", 1)])
    loop.collect()
    behind = loop.train_batch()
    assert behind["logprob_gap_rollouts"] == 2 and behind["logprob_gap"] < 1e-4
    assert behind["weight_sync_alarm"] is False and loop.status.weight_sync_alarms == 0

    # At version 2 the policy recorded log-probs of other weights (make_rollout's are random), for a
    # rollout of the current version and one a version behind.
    alarms_before = REGISTRY.get_sample_value("ragr1_trainer_weight_sync_alarms_total") or 0.0
    produce(redis_client, [make_rollout("bad", 2), make_rollout("bad-behind", 1)])
    with caplog.at_level(logging.ERROR, logger="ragr1.services.trainer.loop"):
        loop.run()
    wrong = loop.steps.read()[-1]
    assert wrong["weight_sync_alarm"] is True and wrong["logprob_gap_rollouts"] == 2
    assert wrong["logprob_gap"] > 1.0
    assert loop.status.weight_sync_alarms == 1 and loop.status.last_logprob_gap == wrong["logprob_gap"]
    assert REGISTRY.get_sample_value("ragr1_trainer_weight_sync_alarms_total") == alarms_before + 1
    assert REGISTRY.get_sample_value("ragr1_trainer_logprob_gap_nats", {"stat": "mean"}) == wrong["logprob_gap"]
    assert any("probable weight-sync failure" in r.getMessage() for r in caplog.records)


def test_a_finished_run_removes_the_prompts_no_worker_has_taken(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=2, max_updates=1, max_staleness=1)
    workers: StreamQueue[common_pb2.PromptTask] = StreamQueue(
        redis_client, PROMPTS, common_pb2.PromptTask, group="rollout-workers", consumer="w0"
    )
    workers.ensure_group()
    loop.prompts.ensure_group()
    assert loop.admission.feed(loop.version) == 4  # (S + 1) x batch
    taken = workers.consume(1)  # a worker is busy with one prompt
    produce(redis_client, [make_rollout("r0"), make_rollout("r1")])
    loop.run()
    assert loop.version == 1
    # The prompt being worked on stays (its rollout may still come); the three untaken ones are gone.
    left = [common_pb2.PromptTask.FromString(f[b"data"]).id for _, f in redis_client.xrange(PROMPTS)]
    assert left == [taken[0].message.id]
    assert workers.undelivered() == 0
    assert workers.consume(10) == []
    # Their rollouts are no longer counted as in flight: 4 admitted - 3 removed, 2 settled.
    assert int(redis_client.hget(loop.admission.counters, "admitted") or 0) == 1


def test_each_update_deletes_the_entries_every_group_is_done_with(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Redis stays bounded over a long run: after each update the trained rollouts and the prompts the
    workers have finished leave their streams; a rollout still waiting and a prompt being worked on stay."""
    loop = make_loop(redis_client, tiny_model_dir, tmp_path, batch_size=2, max_updates=2, max_staleness=1)
    workers: StreamQueue[common_pb2.PromptTask] = StreamQueue(
        redis_client, PROMPTS, common_pb2.PromptTask, group="rollout-workers", consumer="w0"
    )
    workers.ensure_group()
    loop.prompts.ensure_group()
    assert loop.admission.feed(loop.version) == 4
    taken = workers.consume(3)
    workers.ack(taken[:2])  # two prompts done, one being worked on
    produce(redis_client, [make_rollout(f"r{i}") for i in range(5)])
    loop.run()
    assert loop.version == 2
    left = [common_pb2.Rollout.FromString(f[b"data"]).id for _, f in redis_client.xrange(ROLLOUTS)]
    assert left == ["r4"]  # r0-r3 trained; r4 waits for the next update
    prompts = [common_pb2.PromptTask.FromString(f[b"data"]).id for _, f in redis_client.xrange(PROMPTS)]
    assert prompts[0] == taken[2].message.id and taken[0].message.id not in prompts
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["trimmed"] for s in steps] == [4, 2]  # r0, r1 and the two finished prompts; then r2, r3


def _trainer_command(redis_url: str, model_dir: Path, out: Path, prompts: Path) -> list[str]:
    return train_ppo(
        "--redis-url", redis_url,
        "--model", str(model_dir),
        "--output-dir", str(out),
        "--prompts-file", str(prompts),
        "--port", "0",
        "--metrics-port", "0",
        "--batch-size", "4",
        "--max-updates", "6",
        "--max-staleness", "100",
        "--poll-ms", "100",
        "--no-bf16",
        "--micro-batch-size", "2",
        "--keep-checkpoints", "10",
    )


def test_killed_trainer_resumes_and_trains_every_rollout_exactly_once(
    redis_server, redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "qa.jsonl"
    prompts.write_text(
        "".join(json.dumps({"question": f"q{i}?", "golden_answers": ["a"]}) + "\n" for i in range(3))
    )
    rollouts = [make_rollout(f"r{i:02d}") for i in range(24)]
    produce(redis_client, [*rollouts[:10], rollouts[3], *rollouts[10:]])  # r03 twice: a producer retry
    out = tmp_path / "run"
    env = child_env()
    command = _trainer_command(redis_server.url, tiny_model_dir, out, prompts)
    steps = out / "steps.jsonl"
    first = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def updated_once() -> bool:
            assert first.poll() is None, first.stderr.read().decode()[-3000:] if first.stderr else ""
            return steps.exists() and steps.read_text().count("\n") >= 1

        wait_for(updated_once, "the trainer never finished its first update", 240, 0.05)
        # Wait until the next batch is delivered and not yet acknowledged, then kill mid-batch.
        wait_for(lambda: int(redis_client.xpending(ROLLOUTS, "trainer")["pending"]),
                 "the trainer never took its next batch", 240, 0.005)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    assert int(redis_client.xpending(ROLLOUTS, "trainer")["pending"]) > 0, "the kill did not land mid-batch"
    done_before = len(StepLog(steps).read())
    second = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=240)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    records = StepLog(steps).read()
    assert len(records) == 6 and done_before < 6
    trained = [i for r in records for i in r["rollout_ids"]]
    assert len(trained) == len(set(trained)) == 24
    assert set(trained) == {r.id for r in rollouts}
    path, meta = Checkpointer(out / "checkpoints").latest()  # type: ignore[misc]
    assert meta["version"] == 6 and sorted(meta["trained_ids"]) == sorted(trained)
    # What the replicas load holds the model and nothing of the trainer's (optimiser state is large).
    served = policy_dir(path)
    assert (served / "config.json").exists() and (served / "model.safetensors").exists()
    assert (path / "trainer_state.pt").exists() and not list(served.glob("*.pt"))
    assert records[-1]["checkpoint"] == str(served) and records[-1]["weights_bytes"] == size_bytes(served) > 0
    assert int(redis_client.xpending(ROLLOUTS, "trainer")["pending"]) == 0
    assert (out / "curves.png").exists()


def test_a_trainer_that_runs_out_of_signal_exits_with_its_own_code_and_keeps_what_it_trained(
    redis_server, redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # What `ragr1 demo` reads to evaluate the updates made before dynamic sampling found nothing to train on,
    # rather than fail the run: the code, the step records and the announced checkpoint of each update.
    prompts = tmp_path / "qa.jsonl"
    prompts.write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    produce(redis_client, [
        make_rollout("a1", group="A", score=0.0), make_rollout("a2", group="A", score=1.0),  # a spread: update 1
        *(make_rollout(f"{g.lower()}{i}", group=g, score=1.0) for g in ("B", "C") for i in (1, 2)),  # uniform
    ])
    out = tmp_path / "run"
    result = run_train_ppo(
        "--redis-url", redis_server.url, "--model", str(tiny_model_dir), "--output-dir", str(out),
        "--prompts-file", str(prompts), "--port", "0", "--metrics-port", "0", "--no-bf16",
        "--advantage", "grpo", "--batch-size", "2", "--mini-batch-size", "2", "--micro-batch-size", "2",
        "--samples-per-prompt", "2", "--max-uniform-groups", "2", "--max-updates", "3", "--max-staleness", "100",
        "--poll-ms", "100", timeout=240,
    )
    stderr = result.stderr.decode()
    assert result.returncode == NO_SIGNAL_EXIT_CODE, stderr[-3000:]
    assert "all 2 groups sampled for update 2 scored alike" in stderr and "stopped at version 1" in stderr
    records = StepLog(out / "steps.jsonl").read()
    assert [sorted(r["rollout_ids"]) for r in records] == [["a1", "a2"]]
    latest = fleet.latest(redis_client)
    assert latest is not None and latest.version == 1 and latest.path == records[0]["checkpoint"]


@pytest.mark.parametrize("field", ["question", "golden_answers"])
def test_trainer_refuses_a_prompt_file_with_missing_fields_before_training(
    redis_server, tmp_path: Path, field: str
) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "qa.jsonl"
    record = {"question": "q?", "golden_answers": ["a"]}
    del record[field]
    prompts.write_text(
        json.dumps({"question": "ok?", "golden_answers": ["a"]}) + "\n" + json.dumps(record) + "\n"
    )
    result = run_train_ppo(
        "--redis-url", redis_server.url,
        "--prompts-file", str(prompts),
        "--output-dir", str(tmp_path / "out"),
        "--port", "0",
    )
    assert result.returncode == 2
    assert f"{prompts}:2: missing field '{field}'" in result.stderr.decode()
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_the_trainer_announces_its_starting_weights_makes_the_workers_group_and_keeps_versions_in_use(
    redis_client: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before any worker exists the trainer creates the workers' group (the autoscaler's backlog is the
    group's) and announces the model it starts from as v0; pruning (keep 1) keeps v1, which a lagging replica
    reports loading, and removes nothing else a replica uses."""
    config = tiny_config(batch_size=2, max_updates=2, max_staleness=2, model=str(tiny_model_dir))
    checkpoints = Checkpointer(tmp_path / "checkpoints", keep=1)
    publisher = WeightPublisher(redis_client, timeout=600)
    loop = PPOLoop(config, redis_client, [common_pb2.PromptTask(id="t", question="q?")],
                   PPOUpdater.build(config, tiny_model_dir), checkpoints, StepLog(tmp_path / "steps.jsonl"), publisher)
    fleet.report(redis_client, fleet.ReplicaReport("lagging", 0, fleet.LOADING, target=1), 600)
    produce(redis_client, [make_rollout(f"r{i}") for i in range(4)])
    assert loop.run() == 2
    first, *_, last = [fleet.Announcement.read(*e) for e in redis_client.xrange(fleet.WEIGHTS)]
    assert (first.version, first.sha256) == (0, checkpoint_sha256(tiny_model_dir))
    assert first.path == str(tiny_model_dir.resolve()) and last.version == 2
    assert WORKERS.encode() in [g["name"] for g in redis_client.xinfo_groups(PROMPTS)]
    assert checkpoints.versions() == [1, 2]  # v1 in use by "lagging"; nothing older existed
