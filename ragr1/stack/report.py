"""The demo's report: latency distributions scraped from every service's ``/metrics``, the plots, and the lines
that say what RL's updates did."""

from __future__ import annotations

import dataclasses
import math
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ragr1.services.common.metrics import RPC_LATENCY_NAME

# Health probes and bookkeeping calls: fast and many, they would crowd the picture.
PROBES = {"Check", "Watch", "ShardInfo", "Info", "GetWeightVersion", "Status"}


def scrape(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def latency_buckets(text: str, metric: str = RPC_LATENCY_NAME) -> dict[str, list[tuple[float, float]]]:
    """Cumulative ``(le, count)`` buckets of a latency histogram, per RPC method."""
    out: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name == metric + "_bucket":
                out.setdefault(sample.labels["method"], []).append((float(sample.labels["le"]), sample.value))
    return {method: sorted(b) for method, b in out.items()}


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile from cumulative buckets, interpolated linearly inside a bucket (as PromQL does)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def service_latencies(metrics_urls: Mapping[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """Per service and method: calls, p50 and p99 seconds (services that cannot be scraped are skipped)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for service, url in metrics_urls.items():
        try:
            buckets = latency_buckets(scrape(url))
        except OSError:
            continue
        out[service] = {
            method: {"calls": b[-1][1], "p50_seconds": quantile(b, 0.5), "p99_seconds": quantile(b, 0.99)}
            for method, b in buckets.items() if b and b[-1][1] > 0 and method not in PROBES
        }
    return out


def plot_latencies(latencies: Mapping[str, Mapping[str, Mapping[str, float]]], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{s}.{m}", v["p50_seconds"], v["p99_seconds"]) for s, ms in latencies.items() for m, v in ms.items()]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(4, len(rows)) + 1))
    labels = [r[0] for r in rows]
    ax.barh(labels, [r[2] for r in rows], color="#f4a261", label="p99")
    ax.barh(labels, [r[1] for r in rows], color="#2a9d8f", label="p50")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)")
    ax.set_title("gRPC latency per service and method")
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    plt.close(fig)
    return target


@dataclasses.dataclass(frozen=True)
class TrainingPanel:
    title: str
    # (legend, [(step, value)]) per curve.
    curves: list[tuple[str, list[tuple[float, float]]]]
    # Steps at which the training-health alarm this panel shows fired, with the value there.
    alarms: list[tuple[float, float]]
    zero_line: bool = False


# (title, stage, keys, the training-health alarm it shows). A panel may draw several curves: the RL reward of
# the trained batch and of everything sampled (they differ where dynamic sampling skipped groups: the
# trained batch keeps only groups whose scores differ).
_PANELS = (
    ("SFT loss", "sft", ("loss",), None),
    ("RL reward (mean total)", "ppo", ("reward_total", "reward_sampled"), None),
    ("RL groups whose rewards differ", "ppo", ("signal_total",), None),
    ("RL likelihood change of reinforced rollouts (nats/token)", "ppo", ("likelihood_change",),
     "likelihood_falling"),
    ("RL policy entropy (nats/token)", "ppo", ("entropy",), "entropy_low"),
    ("RL KL to reference", "ppo", ("kl",), "kl_high"),
    ("RL response length (tokens)", "ppo", ("response_length", "response_length_max", "generated_length"), None),
    ("RL answer length (words)", "ppo", ("answer_length",), None),
    ("RL clip fraction", "ppo", ("clip_fraction",), None),
    ("log-prob gap trainer vs vLLM", "ppo", ("logprob_gap",), "weight_sync"),
)
_LABELS = {"reward_total": "trained batch", "reward_sampled": "all sampled", "response_length": "mean",
           "response_length_max": "max", "generated_length": "generated (mean)"}


def training_panels(sft: Sequence[Mapping[str, Any]], ppo: Sequence[Mapping[str, Any]]) -> list[TrainingPanel]:
    """What ``training.png`` draws: each panel's curves by step, and where its alarm fired (the step
    records' ``alarms``)."""
    stages = {"sft": sft, "ppo": ppo}
    panels = []
    for title, stage, keys, alarm in _PANELS:
        records = stages[stage]
        curves = []
        for key in keys:
            points = [(float(r.get("step", i + 1)), float(r[key])) for i, r in enumerate(records)
                      if isinstance(r.get(key), int | float)]
            curves.append((_LABELS.get(key, key), points))
        fired = [(float(r.get("step", i + 1)), float(r[keys[0]])) for i, r in enumerate(records)
                 if alarm in r.get("alarms", ()) and isinstance(r.get(keys[0]), int | float)]
        panels.append(TrainingPanel(title, curves, fired, zero_line=keys[0] == "likelihood_change"))
    return panels


def plot_training(sft: Sequence[Mapping[str, Any]], ppo: Sequence[Mapping[str, Any]], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = training_panels(sft, ppo)
    cols = 5
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for label, points in panel.curves:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        if panel.zero_line:
            ax.axhline(0.0, color="grey", linewidth=0.8)
        if panel.alarms:
            ax.scatter([p[0] for p in panel.alarms], [p[1] for p in panel.alarms], marker="x", s=80,
                       color="red", zorder=3, label="alarm")
        if len(panel.curves) > 1 or panel.alarms:
            ax.legend(fontsize=7)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    plt.close(fig)
    return target


def rl_lines(steps: Sequence[Mapping[str, Any]], reward: str, dynamic_sampling: bool,
             stopped: Mapping[str, Any] | None) -> list[str]:
    """RL's updates, one line a measure with a value per update, from the trainer's step records; and where RL
    stopped, when it ran out of signal before its last update (``Demo.rl``)."""
    lines = []
    if steps:
        lines.append(f"\nRL training batches ({reward} reward), per update: mean reward "
                     + " ".join(f"{s['reward_total']:.3f}" for s in steps)
                     + "; exact match " + " ".join(f"{s['reward_exact_match']:.3f}" for s in steps))
        if "signal_f1" in steps[0]:  # groups of several samples
            lines.append("GRPO groups whose samples differ, per update: in F1 "
                         + " ".join(f"{s['signal_f1']:.2f}" for s in steps) + "; in exact match "
                         + " ".join(f"{s['signal_exact_match']:.2f}" for s in steps))
        if dynamic_sampling:
            lines.append("dynamic sampling, per update: groups trained (samples scored differently) / groups "
                         "sampled to find them: "
                         + " ".join(f"{s['groups_trained']}/{s['groups_sampled']}" for s in steps)
                         + "; mean reward of every sampled rollout, skipped groups included: "
                         + " ".join(f"{s['reward_sampled']:.3f}" for s in steps))
        # Where an update's time goes, from the trainer's own records: collecting (prompts fed, rollouts waited for
        # and read), the PPO update, the checkpoint written and hashed.
        lines.append("RL seconds per update, collecting rollouts / updating / checkpointing: "
                     + " ".join(f"{s['queue_seconds']:.0f}/{s.get('update_seconds', 0.0):.0f}/{s['save_seconds']:.0f}"
                                for s in steps))
    if stopped:
        lines.append(f"RL stopped after {stopped['updates']} of {stopped['max_updates']} updates: {stopped['reason']}")
    return lines
