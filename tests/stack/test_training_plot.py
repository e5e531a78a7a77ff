"""The demo's training.png: the training-health curves beside the reward, with the updates where an alarm
fired marked on the curve it watches."""

from __future__ import annotations

from pathlib import Path

from ragr1.stack.report import plot_training, training_panels


def test_training_png_draws_each_health_curve_and_marks_where_its_alarm_fired(tmp_path: Path) -> None:
    sft = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    ppo = [
        {"step": 1, "reward_total": 0.1, "likelihood_change": 0.02, "entropy": 1.2, "kl": 0.0, "response_length": 90,
         "response_length_max": 120, "generated_length": 40, "answer_length": 2.5, "alarms": []},
        {"step": 2, "reward_total": 0.2, "likelihood_change": -0.01, "entropy": 0.05, "kl": 0.7,
         "response_length": 80, "response_length_max": 100, "generated_length": 30, "answer_length": 1.0,
         "alarms": ["entropy_low", "kl_high"]},
        {"step": 3, "reward_total": 0.2, "likelihood_change": -0.03, "entropy": 0.04, "kl": 0.9,
         "response_length": 70, "response_length_max": 90, "generated_length": 25, "answer_length": 1.0,
         "logprob_gap": 0.4, "alarms": ["likelihood_falling", "entropy_low", "kl_high", "weight_sync"]},
    ]
    panels = {p.title: p for p in training_panels(sft, ppo)}
    likelihood = panels["RL likelihood change of reinforced rollouts (nats/token)"]
    assert likelihood.curves == [("likelihood_change", [(1.0, 0.02), (2.0, -0.01), (3.0, -0.03)])]
    assert likelihood.alarms == [(3.0, -0.03)] and likelihood.zero_line
    assert panels["RL policy entropy (nats/token)"].alarms == [(2.0, 0.05), (3.0, 0.04)]
    assert panels["RL KL to reference"].alarms == [(2.0, 0.7), (3.0, 0.9)]
    assert panels["log-prob gap trainer vs vLLM"].alarms == [(3.0, 0.4)]
    lengths = dict(panels["RL response length (tokens)"].curves)
    assert lengths["mean"] == [(1.0, 90.0), (2.0, 80.0), (3.0, 70.0)] and lengths["max"][0] == (1.0, 120.0)
    assert panels["RL answer length (words)"].curves[0][1][0] == (1.0, 2.5)
    assert panels["RL reward (mean total)"].alarms == [] and panels["SFT loss"].curves[0][1] == [(1.0, 2.0), (2.0, 1.5)]
    target = plot_training(sft, ppo, tmp_path / "training.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
