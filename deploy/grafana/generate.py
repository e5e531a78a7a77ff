"""Writes the Grafana dashboards (``deploy/grafana/dashboards/*.json``) from the panel lists below.

The JSON files are checked in (compose mounts them, the Helm chart ships them as ConfigMaps); this
script is where they are edited: ``python deploy/grafana/generate.py``. A test fails when the files
and this script disagree, and runs every expression against a real Prometheus.

``$__rate_interval`` is Grafana's rate window; ``$datasource`` lets one dashboard work with the
compose datasource and with a cluster's own Prometheus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
RATE = "$__rate_interval"
FAILED = 'code!="OK"'


@dataclass(frozen=True)
class Panel:
    title: str
    targets: Sequence[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    width: int = 12


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: Sequence[tuple[str, Sequence[Panel]]] = field(default_factory=tuple)


def rate(metric: str, by: str = "", selector: str = "") -> str:
    sel = f"{{{selector}}}" if selector else ""
    inner = f"rate({metric}{sel}[{RATE}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q: float, histogram: str, by: str = "") -> str:
    labels = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket[{RATE}])))"


def mean(histogram: str, by: str = "") -> str:
    """Mean of a histogram's observations over the window: rate of the sum over rate of the count."""
    return f"{rate(histogram + '_sum', by)} / {rate(histogram + '_count', by)}"


def threshold(alarm: str) -> str:
    """The threshold the trainer exports for one of its training-health alarms."""
    return f'max(ragr1_trainer_alarm_threshold{{alarm="{alarm}"}})'


# The fleet as the trainer reads it from the replicas' reports in Redis (ragr1/services/common/fleet.py).
FLEET_BY_VERSION = Panel(
    "Policy replicas by weight version", [("sum by (version) (ragr1_trainer_fleet_replicas)", "v{{version}}")],
    description="Replicas reporting in Redis, by the version they serve (the trainer's view). Replicas join and "
                "leave as they start and stop; each loads the newest announced version before it takes a prompt.")
FLEET_BY_STATE = Panel(
    "Policy replicas by state", [("sum by (state) (ragr1_trainer_fleet_replicas)", "{{state}}")],
    description="starting, loading (a newer version on its way in), serving, refused (the newest version could "
                "not be loaded: the replica takes no prompts and reports NOT_SERVING; its log says why).")
FLEET_VERSIONS = Panel(
    "Weight version announced and oldest still generating",
    [("ragr1_trainer_policy_version", "announced (trainer)"),
     ("ragr1_trainer_fleet_oldest_version", "oldest generating (replicas)")],
    description="The gap is how far behind the stalest new rollouts start; beyond max_staleness they are dropped.")
FLEET_WORK = Panel(
    "Prompts waiting and in progress, replicas holding them",
    [("sum by (state) (ragr1_trainer_prompts_backlog)", "{{state}}"),
     ("max(ragr1_trainer_prompt_holders)", "replicas holding prompts")],
    description="What the chart's KEDA autoscaler sizes the fleet by (deploy/helm/ragr1/templates/autoscaling.yaml): "
                "waiting (taken by no replica, or handed back by one that left) and in progress (taken, not "
                "acknowledged). In progress with no replica reporting fires Ragr1PromptsStranded.")


def latency(title: str, histogram: str, by: str = "", legend: str = "", description: str = "",
            width: int = 12) -> Panel:
    tag = f"{legend} " if legend else ""
    return Panel(title, [(quantile(0.5, histogram, by), f"{tag}p50"), (quantile(0.99, histogram, by), f"{tag}p99")],
                 unit="s", description=description, width=width)


OVERVIEW = Dashboard(
    "ragr1-overview", "RAG-R1 / Overview",
    "Every gRPC server: calls, errors, latency and in-flight calls by service and method; the Redis queue.",
    rows=[
        ("Calls", [
            Panel("Call rate by service and method",
                  [(rate("ragr1_grpc_server_requests_total", "service, method"), "{{service}} {{method}}")],
                  unit="reqps"),
            Panel("Error ratio by service and method",
                  [(rate("ragr1_grpc_server_requests_total", "service, method", FAILED)
                    + " / " + rate("ragr1_grpc_server_requests_total", "service, method"), "{{service}} {{method}}")],
                  unit="percentunit", description="Share of calls that did not end with OK."),
            Panel("Errors by status code",
                  [(rate("ragr1_grpc_server_requests_total", "service, code", FAILED), "{{service}} {{code}}")],
                  unit="reqps"),
            Panel("In-flight calls", [("sum by (service) (ragr1_grpc_server_in_flight)", "{{service}}")]),
        ]),
        ("Latency", [
            Panel("p50 latency by service and method",
                  [(quantile(0.5, "ragr1_grpc_server_handling_seconds", "service, method"), "{{service}} {{method}}")],
                  unit="s"),
            Panel("p99 latency by service and method",
                  [(quantile(0.99, "ragr1_grpc_server_handling_seconds", "service, method"), "{{service}} {{method}}")],
                  unit="s"),
        ]),
        ("Health and queue", [
            Panel("Servers reporting SERVING", [("sum by (service) (ragr1_grpc_server_serving)", "{{service}}")],
                  description="0 while a server drains or is down."),
            Panel("Queue events", [(rate("ragr1_queue_events_total", "stream, event"), "{{stream}} {{event}}")],
                  unit="ops", description="Produced, delivered, acked, duplicate, reclaimed, dead-lettered."),
        ]),
    ],
)

RETRIEVER = Dashboard(
    "ragr1-retriever", "RAG-R1 / Retriever",
    "Router (embed once, fan out, merge) and shards (micro-batched FAISS search).",
    rows=[
        ("Router", [
            latency("Search latency (router)", "ragr1_retriever_search_seconds", "transport", "{{transport}}"),
            Panel("Search calls and queries",
                  [(rate("ragr1_retriever_search_seconds_count", "transport"), "calls/s {{transport}}"),
                   (rate("ragr1_retriever_queries_per_call_sum"), "queries/s")], unit="ops"),
            latency("Embed time per micro-batch", "ragr1_retriever_embed_seconds"),
            Panel("Queries per call (mean)", [(mean("ragr1_retriever_queries_per_call"), "mean")]),
            Panel("Router time per call by stage (mean)",
                  [(mean("ragr1_retriever_stage_seconds", "stage"), "{{stage}}")], unit="s",
                  description="Where a call's time goes: embed (waiting for and running the encoder batch), "
                              "fanout (until every shard answered), merge (top-k over shards). The stages "
                              "run in turn, so they add up to the call."),
            Panel("Router time per call by stage (p99)",
                  [(quantile(0.99, "ragr1_retriever_stage_seconds", "stage"), "{{stage}}")], unit="s"),
        ]),
        ("Shard readiness", [
            Panel("Shards ready (router's health checks)",
                  [("sum by (shard) (ragr1_retriever_shard_ready)", "shard {{shard}}")],
                  description="1 while the router sees the shard SERVING; also the router's gRPC health "
                              "service ragr1.v1.RetrieverShard/<shard>."),
            Panel("Shard time to ready",
                  [("max by (instance) (ragr1_retriever_shard_time_to_ready_seconds)", "{{instance}}"),
                   ("max by (instance) (ragr1_retriever_shard_index_mmap)", "{{instance}} memory-mapped")],
                  unit="s", description="Seconds from the shard process's start to serving; a memory-mapped "
                                        "index is not read at start."),
        ]),
        ("Shards", [
            Panel("Shard call time seen by the router (p99)",
                  [(quantile(0.99, "ragr1_retriever_shard_call_seconds", "shard"), "shard {{shard}}")], unit="s"),
            Panel("FAISS search time per shard (p50, p99)",
                  [(quantile(0.5, "ragr1_retriever_shard_search_seconds", "instance"), "{{instance}} p50"),
                   (quantile(0.99, "ragr1_retriever_shard_search_seconds", "instance"), "{{instance}} p99")],
                  unit="s"),
            Panel("Shard errors and partial answers",
                  [(rate("ragr1_retriever_shard_errors_total", "shard, reason"), "shard {{shard}} {{reason}}"),
                   (rate("ragr1_retriever_partial_responses_total"), "partial answers")], unit="ops"),
        ]),
        ("Micro-batching", [
            latency("Wait to join a micro-batch", "ragr1_retriever_batch_wait_seconds", "stage", "{{stage}}"),
            Panel("Rows per micro-batch (mean)", [(mean("ragr1_retriever_batch_rows", "stage"), "{{stage}}")]),
        ]),
    ],
)

POLICY = Dashboard(
    "ragr1-policy", "RAG-R1 / Policy and rollouts",
    "vLLM generation and the multi-turn search loop of the rollout workers.",
    rows=[
        ("Generation", [
            Panel("Tokens generated per second",
                  [(rate("ragr1_policy_generated_tokens_total"), "all replicas"),
                   ("ragr1_policy_generation_tokens_per_second", "last minute {{instance}}")]),
            latency("Time to first token", "ragr1_policy_time_to_first_token_seconds"),
            Panel("Engine occupancy",
                  [("ragr1_policy_engine_requests / ragr1_policy_engine_max_num_seqs", "requests / max_num_seqs "
                    "{{instance}}"),
                   ("rate(ragr1_policy_engine_idle_seconds_total[" + RATE + "])", "idle {{instance}}")],
                  unit="percentunit",
                  description="Requests inside each replica's engine over what it batches at once, and the share "
                  "of time it held none: the lock-step loop empties it at the end of every turn and batch."),
        ]),
        ("Rollouts", [
            Panel("Trajectories in flight", [("ragr1_policy_trajectories_in_flight", "{{instance}}")]),
            Panel("Trajectory time by phase (mean)",
                  [(mean("ragr1_policy_trajectory_phase_seconds", "phase"), "{{phase}}")], unit="s",
                  description="Per trajectory: in its own generation requests, in its searches, and waiting (on "
                  "the other trajectories of a lock-step turn)."),
            latency("Rollout batch latency", "ragr1_policy_rollout_seconds"),
            Panel("Share of rollout time waiting on retrieval",
                  [("ragr1_policy_retrieval_wait_ratio", "last minute {{instance}}"),
                   (rate("ragr1_policy_retrieval_wait_seconds_total") + " / "
                    + rate("ragr1_policy_rollout_busy_seconds_total"), "window")], unit="percentunit",
                  description="Of the time a replica had a rollout running, the share in which a retrieval call "
                  "was outstanding; rollouts that overlap (the async loop's groups) count once."),
            Panel("Turns, retrieval rounds and queries per trajectory (mean)",
                  [(mean("ragr1_policy_turns_per_trajectory"), "turns"),
                   (mean("ragr1_policy_retrieval_rounds_per_trajectory"), "retrieval rounds"),
                   (mean("ragr1_policy_queries_per_trajectory"), "queries"),
                   (rate("ragr1_policy_queries_dropped_total") + " / "
                    + rate("ragr1_policy_queries_per_trajectory_count"), "queries past the cap, not searched")]),
            Panel("Trajectories by status", [(rate("ragr1_policy_trajectories_total", "status"), "{{status}}")],
                  unit="ops"),
            Panel("Rollout-worker prompts by outcome",
                  [(rate("ragr1_policy_worker_prompts_total", "outcome"), "{{outcome}}")], unit="ops"),
        ]),
        ("Weights", [
            Panel("Weight version served", [("ragr1_policy_weight_version", "{{instance}}")]),
            Panel("Weight update time and failures",
                  [(quantile(0.99, "ragr1_policy_weight_update_seconds"), "p99 update"),
                   (rate("ragr1_policy_weight_update_failures_total"), "failures/s")], unit="s"),
        ]),
        ("Fleet", [FLEET_BY_VERSION, FLEET_BY_STATE, FLEET_VERSIONS, FLEET_WORK]),
    ],
)

TRAINER = Dashboard(
    "ragr1-trainer", "RAG-R1 / Trainer",
    "PPO: rewards and their parts, KL, losses, staleness of the rollouts, and the queue between them.",
    rows=[
        ("Reward", [
            Panel("Reward parts of the last update's batch", [("avg by (part) (ragr1_trainer_reward)", "{{part}}")]),
            # Its batches' means, not a histogram's sum over its count: ParallelSearch's parts go below 0, and a
            # histogram with buckets below 0 exports no _sum (a sum that can fall is no counter).
            Panel("Reward parts of the reward service's last scored batch (mean over the window)",
                  [(f"avg by (part) (avg_over_time(ragr1_reward_last_batch_mean_score[{RATE}]))", "{{part}}")]),
        ]),
        ("Training health (leads the reward)", [
            Panel("Likelihood change of the rollouts each update reinforced",
                  [("ragr1_trainer_likelihood_change_nats", "change per token (nats)"),
                   ("ragr1_trainer_likelihood_falling_updates", "updates in a row falling"),
                   (threshold("likelihood_falling"), "alarm at (updates in a row)")],
                  description="Mean per-token log-likelihood of the positive-advantage rollouts after the "
                              "update's optimiser steps minus before them. Negative is likelihood displacement; "
                              "the alarm fires after likelihood_falling_updates falls in a row."),
            Panel("Policy entropy over generated tokens",
                  [("ragr1_trainer_entropy_nats", "entropy (nats)"), (threshold("entropy_low"), "floor")],
                  description="Below entropy_floor the policy is collapsing onto few answers (alarm entropy_low)."),
            Panel("KL to the reference",
                  [("ragr1_trainer_kl", "KL (nats per token)"), (threshold("kl_high"), "ceiling")],
                  description="Above kl_ceiling the policy has drifted far from the reference (alarm kl_high)."),
            Panel("Response and answer length",
                  [("avg by (stat) (ragr1_trainer_response_length_tokens)", "response tokens {{stat}}"),
                   ("ragr1_trainer_generated_length_tokens", "generated tokens (mean)"),
                   ("ragr1_trainer_answer_length_words", "answer words (mean)")],
                  description="Per rollout of the last update; inserted <information> tokens count in the "
                              "response, not in the generated tokens."),
            Panel("Training-health alarms by alarm",
                  [("sum by (alarm) (ragr1_trainer_health_alarms_total)", "{{alarm}}")],
                  description="Updates on which each alarm fired, since the trainer started; the alert rules "
                              "(deploy/prometheus/alerts.yml) fire on the same conditions."),
        ]),
        ("Update", [
            Panel("Losses", [("avg by (kind) (ragr1_trainer_loss)", "{{kind}}")]),
            Panel("Clip fraction", [("ragr1_trainer_clip_fraction", "policy ratio clipped")], unit="percentunit"),
            Panel("Policy ratio and approx KL (proximal vs current)",
                  [("avg by (stat) (ragr1_trainer_policy_ratio)", "ratio {{stat}}"),
                   ("ragr1_trainer_approx_kl", "approx KL")],
                  description="Over the mini-batch steps of the last update; the clip acts outside [0.8, 1.2]."),
            Panel("Learning rate by model", [("avg by (model) (ragr1_trainer_learning_rate)", "{{model}}")],
                  description="Actor and critic, each with its own linear warm-up."),
            Panel("Gradient norm by model (before clipping)",
                  [("avg by (model) (ragr1_trainer_grad_norm)", "{{model}}")]),
            Panel("Training tokens per second", [("ragr1_trainer_tokens_per_second", "tokens/s")]),
            latency("Update time", "ragr1_trainer_update_seconds"),
            Panel("Policy version and updates",
                  [("ragr1_trainer_policy_version", "version checkpointed"),
                   ("max(ragr1_policy_weight_version)", "version served (newest replica)"),
                   ("min(ragr1_policy_weight_version)", "version served (oldest replica)")]),
        ]),
        ("Weight-sync check", [
            Panel("Log-prob gap: trainer vs vLLM on rollouts of the trainer's last two versions",
                  [("avg by (stat) (ragr1_trainer_logprob_gap_nats)", "{{stat}}"),
                   (threshold("weight_sync"), "logprob_gap_threshold")],
                  description="Mean and max |trainer - vLLM| log-prob per generated token (nats). The normal "
                              "gap is bf16 rounding; a mean above logprob_gap_threshold means the policy serves "
                              "other weights than the trainer holds."),
            Panel("Weight-sync alarms", [("sum(ragr1_trainer_weight_sync_alarms_total)", "alarms since start")],
                  description="Updates whose mean log-prob gap was above the threshold (probable weight-sync "
                              "failure)."),
        ]),
        ("Staleness and queue", [
            Panel("Rollout staleness (policy versions behind)",
                  [(quantile(0.5, "ragr1_trainer_rollout_staleness_versions"), "p50"),
                   (quantile(0.99, "ragr1_trainer_rollout_staleness_versions"), "p99")]),
            Panel("Rollouts consumed by outcome",
                  [(rate("ragr1_trainer_rollouts_total", "outcome"), "{{outcome}}")], unit="ops",
                  description="trained, stale (dropped), duplicate, dead_lettered."),
            Panel("Queue depth (entries not yet acknowledged)", [("sum by (stream) (ragr1_trainer_queue_depth)",
                                                                  "{{stream}}")]),
            latency("Queue lag: rollout in the stream to its update checkpointed",
                    "ragr1_trainer_rollout_age_seconds"),
            Panel("Share of update time spent on the queue",
                  [(rate("ragr1_trainer_queue_seconds_sum") + " / " + rate("ragr1_trainer_update_seconds_sum"),
                    "queue / update")], unit="percentunit"),
            Panel("Queue events", [(rate("ragr1_queue_events_total", "stream, event"), "{{stream}} {{event}}")],
                  unit="ops"),
        ]),
        ("Weights to the policy replicas", [FLEET_BY_VERSION, FLEET_BY_STATE, FLEET_VERSIONS, FLEET_WORK]),
    ],
)

DASHBOARDS = (OVERVIEW, RETRIEVER, POLICY, TRAINER)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, object]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, object]:
    panels: list[dict[str, object]] = []
    y = 0
    next_id = 1
    for row_title, row_panels in dashboard.rows:
        panels.append({"id": next_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x = 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
        y += 8
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["ragr1"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "utc",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
        ]},
        "annotations": {"list": []},
        "links": [{"title": "RAG-R1", "type": "dashboards", "tags": ["ragr1"], "asDropdown": True}],
        "panels": panels,
    }


def files() -> dict[str, str]:
    """File name -> JSON text, exactly as checked in."""
    return {f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
