"""Prometheus metrics of the policy service and its rollout workers."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ragr1.services.common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS

TIME_TO_FIRST_TOKEN = Histogram(
    "ragr1_policy_time_to_first_token_seconds",
    "Time from submitting a generation request to its first token.",
    buckets=LATENCY_BUCKETS,
)
GENERATED_TOKENS = Counter(
    "ragr1_policy_generated_tokens_total", "Tokens the model generated (rate() gives tokens/s)."
)
GENERATION_TOKENS_PER_SECOND = Gauge(
    "ragr1_policy_generation_tokens_per_second",
    "Generated tokens per second of the replica over the last minute: the tokens of the rollouts and generations "
    "that ended in it, over the time at least one ran (calls running at once counted once).",
)
ROLLOUT_LATENCY = Histogram(
    "ragr1_policy_rollout_seconds", "Wall time of one batch of rollouts.", buckets=LATENCY_BUCKETS
)
TURNS = Histogram(
    "ragr1_policy_turns_per_trajectory", "Generation turns per trajectory.", buckets=SIZE_BUCKETS
)
QUERIES = Histogram(
    "ragr1_policy_queries_per_trajectory", "Search queries per trajectory.", buckets=(0, *SIZE_BUCKETS)
)
QUERIES_DROPPED = Counter(
    "ragr1_policy_queries_dropped_total",
    "Queries written past max_queries_per_search in one search, and not searched (RAG-R1 searches all).",
)
RETRIEVAL_ROUNDS = Histogram(
    "ragr1_policy_retrieval_rounds_per_trajectory",
    "Retrieval rounds per trajectory.",
    buckets=(0, *SIZE_BUCKETS),
)
RETRIEVAL_WAIT_SHARE = Gauge(
    "ragr1_policy_retrieval_wait_ratio",
    "Share of the last minute's rollout time (at least one rollout or generation running) in which at least one "
    "retrieval call was outstanding.",
)
RETRIEVAL_WAIT = Counter(
    "ragr1_policy_retrieval_wait_seconds_total",
    "Wall time in which at least one retrieval call of the rollouts was outstanding (calls that overlap counted "
    "once).",
)
ROLLOUT_BUSY = Counter(
    "ragr1_policy_rollout_busy_seconds_total",
    "Wall time in which at least one rollout or generation ran (calls that overlap counted once): what the "
    "retrieval wait is a share of.",
)
TRAJECTORIES = Counter(
    "ragr1_policy_trajectories_total",
    "Finished trajectories by status (retrieval_error counted here).",
    ["status"],
)
TRAJECTORY_PHASE = Histogram(
    "ragr1_policy_trajectory_phase_seconds",
    "Seconds of one trajectory by phase: generation (its own engine requests), retrieval (its search calls), "
    "waiting (the rest: on the other trajectories of a lock-step turn, for the event loop).",
    ["phase"],
    buckets=LATENCY_BUCKETS,
)
TRAJECTORIES_IN_FLIGHT = Gauge(
    "ragr1_policy_trajectories_in_flight",
    "Trajectories running (lock-step: until their whole batch has finished, which is when their slots free).",
)
ENGINE_REQUESTS = Gauge(
    "ragr1_policy_engine_requests", "Generation requests inside the engine (vLLM's running and queued ones)."
)
ENGINE_CAPACITY = Gauge(
    "ragr1_policy_engine_max_num_seqs", "Sequences the engine batches at once (its max_num_seqs): occupancy's 1."
)
WORKER_MAX_IN_FLIGHT = Gauge(
    "ragr1_policy_worker_max_in_flight",
    "Trajectories the async rollout worker keeps running: its max_in_flight, or its engine's batch (0 there).",
)
ENGINE_IDLE = Counter(
    "ragr1_policy_engine_idle_seconds_total",
    "Seconds the engine held no request, counted when the next one arrives (rate() gives the idle fraction).",
)
WEIGHT_VERSION = Gauge("ragr1_policy_weight_version", "Weight version being served.")
WEIGHT_UPDATE = Histogram(
    "ragr1_policy_weight_update_seconds",
    "Wall time of a weight update, waiting for rollouts included.",
    buckets=LATENCY_BUCKETS,
)
WEIGHT_UPDATE_FAILURES = Counter(
    "ragr1_policy_weight_update_failures_total", "Refused or failed weight updates."
)
WORKER_BATCHES = Counter(
    "ragr1_policy_worker_batches_total", "Rollout-worker batches by outcome.", ["outcome"]
)
WORKER_PROMPTS = Counter(
    "ragr1_policy_worker_prompts_total",
    "Prompts a rollout worker finished, by outcome (acked; requeued: handed back after a passing failure, a "
    "delivery counted, due again after a backoff; dead_lettered; handed_back: left unfinished to the other "
    "workers, no delivery counted).",
    ["outcome"],
)
WORKER_REQUEUES = Counter(
    "ragr1_policy_worker_requeues_total",
    "Prompts a rollout worker handed back after a passing failure, by what failed (rollout, scoring, "
    "acknowledgement, retrieval_error, aborted).",
    ["reason"],
)
WORKER_DEPENDENCY_DOWN = Gauge(
    "ragr1_policy_worker_dependency_down",
    "1 while a rollout worker takes no prompt because this dependency (retriever, reward) answered UNAVAILABLE.",
    ["dependency"],
)
WORKER_LEASES_LAPSED = Counter(
    "ragr1_policy_worker_leases_lapsed_total",
    "Held prompts whose rollouts made no progress within stall_seconds: the worker stopped renewing their lease.",
)
