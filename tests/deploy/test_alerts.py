"""The training-health alert rules (deploy/prometheus/alerts.yml): each one checked by `promtool test rules`
on synthetic series, with the trainer's default thresholds as the series it exports; one rule per alarm
of the trainer, comparing the alarm's metric the way the trainer does; shipped by compose and the chart."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import yaml

from ragr1.services.common import fleet
from ragr1.services.common.streams import Backlog
from ragr1.services.trainer.config import HealthSettings, PPOConfig
from ragr1.services.trainer.health import ALARMS, thresholds
from ragr1.services.trainer.publisher import StrandedAlarm
from tests.deploy.charts import EVERYTHING_ON, container, render
from tests.deploy.compose import config as compose_config
from tests.deploy.conftest import CHART, ROOT, tool
from tests.deploy.dashboards import METRIC, defined_metrics
from tests.deploy.test_chart_matches_compose import chart_argv, flags, settings
from tests.deploy.test_compose import mounts

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
TARGET = 'instance="trainer:51054", job="ragr1"'
TARGET_LABELS = {"instance": "trainer:51054", "job": "ragr1"}
# The rule that watches each alarm, by the alarm's name.
RULES = {"likelihood_falling": "Ragr1LikelihoodFalling", "entropy_low": "Ragr1EntropyLow", "kl_high": "Ragr1KLHigh",
         "weight_sync": "Ragr1WeightSyncGap"}


def rules(group: str = "ragr1-training-health") -> dict[str, dict[str, Any]]:
    (found,) = [g for g in yaml.safe_load(ALERTS.read_text())["groups"] if g["name"] == group]
    return {rule["alert"]: rule for rule in found["rules"]}


def test_every_alarm_of_the_trainer_has_one_rule_comparing_its_metric_with_its_threshold() -> None:
    shipped = rules()
    assert set(shipped) == set(RULES.values())
    for alarm in ALARMS:
        rule = shipped[RULES[alarm.name]]
        assert rule["labels"]["alarm"] == alarm.name
        expr = " ".join(rule["expr"].split())
        # The trainer's own comparison, against the threshold it exports for this alarm.
        comparison = re.escape(f" {alarm.comparison} ignoring(")
        assert re.search(rf"{alarm.metric_name}(\{{[^}}]*\}})?{comparison}[a-z, ]*\)( group_left)? "
                         rf'ragr1_trainer_alarm_threshold\{{alarm="{alarm.name}"\}}', expr), (alarm.name, expr)
        # No threshold written into a rule (the guard against a fresh trainer's zero gauges aside).
        assert not re.search(r"(>=|<=|>|<|==|!=) ?-?[0-9]", expr.replace("ragr1_trainer_updates_total > 0", "")), expr


def test_the_rules_name_only_metrics_the_code_exports() -> None:
    defined = defined_metrics()
    named = set(METRIC.findall(ALERTS.read_text()))
    assert named and named <= defined, named - defined


def _value(value: float) -> str:
    """$value as Prometheus's templates print it (Go's %v of a float64)."""
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) else repr(value)


def _expected(alert: str, value: float, extra: dict[str, str] | None = None,
              group: str = "ragr1-training-health") -> dict[str, Any]:
    rule = rules(group)[alert]
    annotations = {k: v.replace("{{ $value }}", _value(value)).replace("{{ $labels.instance }}",
                                                                        TARGET_LABELS["instance"])
                   for k, v in rule["annotations"].items()}
    return {"exp_labels": {**TARGET_LABELS, **(extra or {}), **rule["labels"]}, "exp_annotations": annotations}


def _series(metric: str, values: str, labels: str = "") -> dict[str, str]:
    inner = f"{labels}, {TARGET}" if labels else TARGET
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _threshold(alarm: str, limits: dict[str, float], samples: int) -> dict[str, str]:
    return _series("ragr1_trainer_alarm_threshold", f"{limits[alarm]}x{samples - 1}", f'alarm="{alarm}"')


def _cases(limits: dict[str, float]) -> list[dict[str, Any]]:
    """One promtool test per situation: (input series, [(minute, alert, expected alerts)])."""
    floor, ceiling, gap = limits["entropy_low"], limits["kl_high"], limits["weight_sync"]
    falling = int(limits["likelihood_falling"])
    cases = [
        # Falls in a row counted by the trainer: fires from the threshold on, stops when a rise resets it.
        ([_threshold("likelihood_falling", limits, 5),
          _series("ragr1_trainer_likelihood_falling_updates", f"0 {falling - 1} {falling} {falling + 1} 0")],
         [(0, "Ragr1LikelihoodFalling", []), (1, "Ragr1LikelihoodFalling", []),
          (2, "Ragr1LikelihoodFalling", [_expected("Ragr1LikelihoodFalling", falling)]),
          (3, "Ragr1LikelihoodFalling", [_expected("Ragr1LikelihoodFalling", falling + 1)]),
          (4, "Ragr1LikelihoodFalling", [])]),
        # A fresh trainer's entropy gauge reads 0 before any update: no alert until an update is counted;
        # then below the floor, a broken update (NaN), and back above it.
        ([_threshold("entropy_low", limits, 6),
          _series("ragr1_trainer_entropy_nats", f"0 {floor * 20} {floor / 2} NaN {floor * 5} {floor}"),
          _series("ragr1_trainer_updates_total", "0 1 2 3 4 5")],
         [(0, "Ragr1EntropyLow", []), (1, "Ragr1EntropyLow", []),
          (2, "Ragr1EntropyLow", [_expected("Ragr1EntropyLow", floor / 2)]),
          (3, "Ragr1EntropyLow", [_expected("Ragr1EntropyLow", math.nan)]),
          (4, "Ragr1EntropyLow", []), (5, "Ragr1EntropyLow", [])]),
        ([_threshold("kl_high", limits, 5),
          _series("ragr1_trainer_kl", f"0 {ceiling} {ceiling * 2} NaN {ceiling / 2}")],
         [(0, "Ragr1KLHigh", []), (1, "Ragr1KLHigh", []), (2, "Ragr1KLHigh", [_expected("Ragr1KLHigh", ceiling * 2)]),
          (3, "Ragr1KLHigh", [_expected("Ragr1KLHigh", math.nan)]), (4, "Ragr1KLHigh", [])]),
        # The mean gap decides; a max above the threshold alone is one token's rounding.
        ([_threshold("weight_sync", limits, 4),
          _series("ragr1_trainer_logprob_gap_nats", f"{gap / 4} {gap * 5} NaN {gap}", 'stat="mean"'),
          _series("ragr1_trainer_logprob_gap_nats", f"{gap * 3}x3", 'stat="max"')],
         [(0, "Ragr1WeightSyncGap", []),
          (1, "Ragr1WeightSyncGap", [_expected("Ragr1WeightSyncGap", gap * 5, {"stat": "mean"})]),
          (2, "Ragr1WeightSyncGap", [_expected("Ragr1WeightSyncGap", math.nan, {"stat": "mean"})]),
          (3, "Ragr1WeightSyncGap", [])]),
        # An alarm the trainer turned off exports no threshold: its rule matches nothing, NaN included.
        ([_series("ragr1_trainer_likelihood_falling_updates", "9x2"), _series("ragr1_trainer_entropy_nats", "NaN 0"),
          _series("ragr1_trainer_kl", "NaN 99"), _series("ragr1_trainer_updates_total", "5x2")],
         [(m, alert, []) for m in (0, 1, 2) for alert in ("Ragr1LikelihoodFalling", "Ragr1EntropyLow", "Ragr1KLHigh")]),
    ]
    return [
        {"interval": "1m", "input_series": series,
         "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": expected}
                             for minute, alert, expected in checks]}
        for series, checks in cases
    ]


def test_promtool_fires_each_rule_on_synthetic_series_at_the_trainers_default_thresholds(tmp_path: Path) -> None:
    limits = thresholds(HealthSettings())
    assert set(limits) == set(RULES)  # every alarm is on by default
    spec = tmp_path / "alerts.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m",
                                    "tests": _cases(limits)}, sort_keys=False))
    result = subprocess.run([tool("promtool"), "test", "rules", str(spec)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_rule_that_stopped_firing_would_fail_its_promtool_test(tmp_path: Path) -> None:
    """The harness can fail: the same test against a copy of the rules whose entropy comparison is turned
    the other way reports the missing alert."""
    shipped = ALERTS.read_text()
    broken = shipped.replace("ragr1_trainer_entropy_nats < ignoring", "ragr1_trainer_entropy_nats > ignoring")
    assert broken != shipped
    (tmp_path / "alerts.yml").write_text(broken)
    spec = tmp_path / "alerts.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(tmp_path / "alerts.yml")], "evaluation_interval": "1m",
                                    "tests": _cases(thresholds(HealthSettings()))}, sort_keys=False))
    result = subprocess.run([tool("promtool"), "test", "rules", str(spec)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "Ragr1EntropyLow" in result.stdout + result.stderr


def test_the_stranded_alert_fires_when_the_trainer_says_prompts_are_stranded_past_its_threshold(
    tmp_path: Path,
) -> None:
    """The trainer counts how long prompts have had no replica taking them (``StrandedAlarm``: none
    serving; tests/trainer/test_publisher.py) and exports its threshold: a fleet scaled up from zero whose pods
    take nineteen minutes to load stays silent, a fleet stranded past the threshold (every replica refused, say)
    fires, and a trainer with the alarm off exports no threshold and never fires."""
    stranded = "Ragr1PromptsStranded"
    threshold = next(f.default for f in dataclasses.fields(PPOConfig) if f.name == "prompts_stranded_seconds")
    assert isinstance(threshold, float) and threshold % 60 == 0
    minutes = int(threshold // 60)
    limit = _series("ragr1_trainer_alarm_threshold", f"{threshold}x{minutes + 5}", 'alarm="prompts_stranded"')
    fired = [_expected(stranded, threshold + 60, group="ragr1-fleet")]
    cases = [
        # Scaled up from zero: a replica loads the weights a minute before the threshold; the count goes back to 0.
        ([limit, _series("ragr1_trainer_prompts_stranded_seconds", f"0+60x{minutes - 1} 0x6")],
         [(m, stranded, []) for m in (minutes - 2, minutes - 1, minutes, minutes + 3)]),
        # Stranded past the threshold: fires from the threshold on, stops once a replica takes prompts.
        ([limit, _series("ragr1_trainer_prompts_stranded_seconds", f"0+60x{minutes + 1} 0x3")],
         [(minutes - 1, stranded, []),
          (minutes, stranded, [_expected(stranded, threshold, group="ragr1-fleet")]),
          (minutes + 1, stranded, fired), (minutes + 2, stranded, [])]),
        # The alarm off: no threshold exported, nothing fires.
        ([_series("ragr1_trainer_prompts_stranded_seconds", f"0+60x{minutes + 5}")],
         [(minutes + 5, stranded, [])]),
    ]
    tests = [{"interval": "1m", "input_series": series,
              "alert_rule_test": [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": e} for m, a, e in checks]}
             for series, checks in cases]
    spec = tmp_path / "fleet.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    result = subprocess.run([tool("promtool"), "test", "rules", str(spec)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stranded_alert_fires_for_a_fleet_that_keeps_refusing_a_version(tmp_path: Path) -> None:
    """From the replicas' reports to the alert: every replica refused v3 and tries it again, reporting loading,
    then refused, in turn, while prompts wait. The trainer's count (``StrandedAlarm`` on those reports, read once
    a minute as Prometheus scrapes it) is the series promtool evaluates the rule on: it fires at the threshold
    (a count that a loading replica started again never reached it)."""
    stranded = "Ragr1PromptsStranded"
    threshold = next(f.default for f in dataclasses.fields(PPOConfig) if f.name == "prompts_stranded_seconds")
    assert isinstance(threshold, float) and threshold % 60 == 0
    minutes = int(threshold // 60)
    now = [0.0]
    alarm = StrandedAlarm(threshold, lambda: now[0])
    waiting = Backlog(waiting=3, in_progress=1, holders=0)  # the one in progress: held by a replica gone
    cycle = (fleet.REFUSED, fleet.LOADING)
    scraped = []
    for minute in range(minutes + 3):
        now[0] = 60.0 * minute
        reports = [fleet.ReplicaReport(f"policy-{i}", 2, cycle[(minute + i) % 2], target=3) for i in range(2)]
        scraped.append(alarm.observe(waiting, reports))
    series = [_series("ragr1_trainer_alarm_threshold", f"{threshold}x{minutes + 2}", 'alarm="prompts_stranded"'),
              _series("ragr1_trainer_prompts_stranded_seconds", " ".join(f"{v:g}" for v in scraped))]
    checks = [(minutes - 1, []), (minutes, [_expected(stranded, threshold, group="ragr1-fleet")]),
              (minutes + 2, [_expected(stranded, threshold + 120, group="ragr1-fleet")])]
    tests = [{"interval": "1m", "input_series": series,
              "alert_rule_test": [{"eval_time": f"{m}m", "alertname": stranded, "exp_alerts": e} for m, e in checks]}]
    spec = tmp_path / "refusing.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    result = subprocess.run([tool("promtool"), "test", "rules", str(spec)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_loads_the_rules_file() -> None:
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert scrape["rule_files"] == ["alerts.yml"]  # relative to prometheus.yml, which is mounted beside it
    volumes = mounts(compose_config("docker-compose.yml")["services"]["prometheus"])
    assert volumes["/etc/prometheus/alerts.yml"] == str(ALERTS)
    assert volumes["/etc/prometheus/prometheus.yml"] == str(ROOT / "deploy" / "prometheus" / "prometheus.yml")
    check = subprocess.run([tool("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True,
                           timeout=60)
    found = f"SUCCESS: {len(RULES) + len(rules('ragr1-fleet'))} rules found"
    assert check.returncode == 0 and found in check.stdout, check.stdout + check.stderr


def test_the_chart_ships_the_same_rules_with_its_servicemonitor_and_trainer_thresholds_it_passes() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        off = render(chart)
        on = render(chart, EVERYTHING_ON)
        custom = render(chart, {"trainer": {"alarms": {"likelihoodFallingUpdates": 5, "entropyFloor": 0.25,
                                                       "klCeiling": 2, "logprobGapThreshold": 0.05}}})
    finally:
        chart.close()
    assert not [k for k in off if k[0] == "PrometheusRule"]
    rule = on[("PrometheusRule", "ragr1")]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "ragr1"

    def health(objects: dict[tuple[str, str], dict[str, Any]]) -> HealthSettings:
        trainer = container(objects, "Deployment", "trainer")
        return settings(PPOConfig, flags(chart_argv(trainer)), {})  # type: ignore[no-any-return]

    fields = ("likelihood_falling_updates", "entropy_floor", "kl_ceiling", "logprob_gap_threshold")
    # The chart's defaults are the trainer's own: values.yaml states them, the trainer decides them.
    assert {f: getattr(health(off), f) for f in fields} == {f: getattr(HealthSettings(), f) for f in fields}
    assert {f: getattr(health(custom), f) for f in fields} == dict(zip(fields, (5, 0.25, 2.0, 0.05), strict=True))
