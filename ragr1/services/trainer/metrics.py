"""The trainer's Prometheus metrics (``ragr1_trainer_…``, base units)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ragr1.services.common.metrics import LATENCY_BUCKETS

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16)

UPDATES = Counter("ragr1_trainer_updates_total", "PPO updates checkpointed.")
ROLLOUTS = Counter(
    "ragr1_trainer_rollouts_total",
    "Rollouts consumed, by outcome (trained, stale, duplicate, incomplete_group, uniform_group).",
    ["outcome"],
)
STALENESS = Histogram(
    "ragr1_trainer_rollout_staleness_versions",
    "Trainer version minus the rollout's policy version, when consumed.",
    buckets=STALENESS_BUCKETS,
)
ROLLOUT_AGE = Histogram(
    "ragr1_trainer_rollout_age_seconds",
    "Time from a rollout entering the stream to its update being checkpointed (queue lag).",
    buckets=LATENCY_BUCKETS,
)
REWARD = Gauge("ragr1_trainer_reward", "Mean reward part of the last update's batch.", ["part"])
GROUP_SIGNAL = Gauge(
    "ragr1_trainer_group_signal_ratio",
    "Share of the last batch's GRPO groups whose members' reward part differs (0: nothing to learn from).",
    ["part"],
)
LOSS = Gauge("ragr1_trainer_loss", "Loss of the last update, by kind (policy, value).", ["kind"])
KL = Gauge("ragr1_trainer_kl", "Mean KL to the reference policy in the last update.")
ENTROPY = Gauge("ragr1_trainer_entropy_nats", "Mean policy entropy on generated tokens in the last update.")
CLIP_FRACTION = Gauge(
    "ragr1_trainer_clip_fraction", "Share of generated tokens whose policy ratio was clipped in the last update."
)
APPROX_KL = Gauge(
    "ragr1_trainer_approx_kl",
    "Mean k1 between the proximal policy (before the update) and the policy being stepped, last update.",
)
RATIO = Gauge(
    "ragr1_trainer_policy_ratio",
    "Policy ratio pi/pi_proximal over the generated tokens of the last update, by stat (mean, min, max).",
    ["stat"],
)
LEARNING_RATE = Gauge("ragr1_trainer_learning_rate", "Learning rate of the last update, by model.", ["model"])
GRAD_NORM = Gauge(
    "ragr1_trainer_grad_norm", "Mean global gradient norm (before clipping) of the last update, by model.", ["model"]
)
LOGPROB_GAP = Gauge(
    "ragr1_trainer_logprob_gap_nats",
    "Weight-sync check: |trainer - vLLM| log-prob per generated token of the rollouts sampled at the "
    "trainer's version or one behind, last update where there were any, by stat (mean, max).",
    ["stat"],
)
WEIGHT_SYNC_ALARMS = Counter(
    "ragr1_trainer_weight_sync_alarms_total",
    "Updates whose mean log-prob gap was above the threshold: probable weight-sync failures.",
)
LIKELIHOOD_CHANGE = Gauge(
    "ragr1_trainer_likelihood_change_nats",
    "Change the last update made to the mean per-token log-likelihood of the rollouts it reinforced "
    "(positive advantage), measured after its optimiser steps; negative: likelihood displacement.",
)
LIKELIHOOD_FALLING = Gauge(
    "ragr1_trainer_likelihood_falling_updates",
    "Updates in a row that lowered the log-likelihood of the rollouts they reinforced.",
)
RESPONSE_LENGTH = Gauge(
    "ragr1_trainer_response_length_tokens",
    "Response tokens (generated and inserted) of the last update's rollouts, by stat (mean, max).",
    ["stat"],
)
GENERATED_LENGTH = Gauge(
    "ragr1_trainer_generated_length_tokens", "Mean generated tokens (loss mask 1) per rollout of the last update."
)
ANSWER_LENGTH = Gauge(
    "ragr1_trainer_answer_length_words",
    "Mean words inside the last <answer> of the last update's rollouts (0 for a rollout without one).",
)
ALARM_THRESHOLD = Gauge(
    "ragr1_trainer_alarm_threshold",
    "Threshold of each alarm that is on (the trainer's settings: the training-health alarms and "
    "prompts_stranded); the alert rules compare against it.",
    ["alarm"],
)
HEALTH_ALARMS = Counter(
    "ragr1_trainer_health_alarms_total", "Updates on which a training-health alarm fired, by alarm.", ["alarm"]
)
TOKENS_PER_SECOND = Gauge("ragr1_trainer_tokens_per_second", "Training throughput of the last update.")
UPDATE_SECONDS = Histogram(
    "ragr1_trainer_update_seconds",
    "Wall time of one update (forward passes, optimiser).",
    buckets=LATENCY_BUCKETS,
)
QUEUE_SECONDS = Histogram(
    "ragr1_trainer_queue_seconds",
    "Time per update spent on the queue (feeding prompts, reading, acknowledging).",
    buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge(
    "ragr1_trainer_queue_depth", "Entries in a stream not yet acknowledged by its group.", ["stream"]
)
POLICY_VERSION = Gauge("ragr1_trainer_policy_version", "Latest weight version checkpointed.")
FLEET_REPLICAS = Gauge(
    "ragr1_trainer_fleet_replicas",
    "Policy replicas reporting in Redis, by the weight version they serve and their state (starting, loading, "
    "serving, refused).",
    ["version", "state"],
)
FLEET_OLDEST_VERSION = Gauge(
    "ragr1_trainer_fleet_oldest_version",
    "Oldest weight version a replica making rollouts serves (serving, or loading the next while the rollouts it "
    "holds finish): the version the stalest new rollouts carry; NaN while no replica makes rollouts.",
)
# The prompts stream as the rollout workers' consumer group sees it: what the fleet's autoscaler sizes the
# policy replicas by (deploy/helm/ragr1/templates/autoscaling.yaml, ``fleet.wanted_replicas``).
PROMPTS_BACKLOG = Gauge(
    "ragr1_trainer_prompts_backlog",
    "Prompts of the rollout workers' group by state: waiting (no replica works on them: never taken, or handed "
    "back by a replica that left) and in_progress (taken by a replica, not acknowledged yet).",
    ["state"],
)
PROMPT_HOLDERS = Gauge(
    "ragr1_trainer_prompt_holders", "Rollout workers holding at least one prompt in progress."
)
PROMPTS_STRANDED = Gauge(
    "ragr1_trainer_prompts_stranded_seconds",
    "How long prompts have waited or been in progress while no policy replica takes prompts (none reports "
    "serving: none there, or all starting, loading or refused); 0 while one does, or no prompt is left.",
)
