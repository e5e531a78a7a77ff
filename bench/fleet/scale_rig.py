"""The rollout fleet at cluster scale on one machine: the product's own processes, with the engines and the PPO
step simulated (bench/fleet/simulated.py), to measure what our code costs per trajectory at many replicas and hundreds
of trajectories in flight.

Real: Redis (the product's server settings), the retriever's router and shard processes over the shipped corpus
(``--passages``: its first N, 0 for all), the reward service, the rollout worker of each replica exactly as the
policy server wires it (``StreamingRolloutWorker`` from ``build_worker``, the agent loop, ``RetrieverSearch`` and
``RewardServiceScorer`` over gRPC, the ``WeightFollower``), and the trainer's consuming side (``PPOLoop``:
admission, groups, the step records, checkpoints and version announcements). Simulated, and labelled so in every
figure: each replica's vLLM engine (``SimulatedEngine``: continuous batching timed by a published step time of a
named model and card, ``--model-base-ms``/``--model-per-seq-ms``) and the PPO step (a timed wait). Each replica's
worker runs in a process of its own, as on a cluster (``--replicas-per-process`` packs several).

For each number of replicas (``--replicas``) and engine batch (``--sizes``: ``max_num_seqs``; the workers keep
the product's default in flight, the engine's batch, unless ``--max-in-flight``), the engines are slowed by a
factor that brings the fleet's simulated ceiling (every engine full at its batch) to ``--rate`` trajectories/s,
so that our processes fit this machine's cores (``--slowdown`` fixes it instead); search delay
(``--search-ms``), weight loads and the PPO step are slowed by the same factor. A run waits for the fleet to warm
up, then measures: trajectories/s against the ceiling, each process's CPU time per trajectory (from /proc, which
contention inflates far less than wall time; the idle rate before the run is reported too), Redis commands and
bytes per rollout (INFO commandstats, less the rig's own reads), how long the trainer waited for each batch,
searches/s at the router and the search calls' p50/p99.

    PYTHONPATH=. python bench/fleet/scale_rig.py [--replicas 1 4 16] [--sizes 8 64 256] [--rate 12] [--search-ms 0]
        [--passages 0] [--shards 2] [--samples 5] [--max-in-flight 0] [--replicas-per-process 1] [--out FILE]
        [--profile worker|trainer|router|reward]

``--profile ROLE`` runs that role's first process under cProfile and prints its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import cProfile
import dataclasses
import json
import math
import os
import pstats
import random
import re
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench.common import header  # noqa: E402
from bench.fleet.simulated import (  # noqa: E402
    CONFIG,
    H100_LLAMA_8B,
    LatencyModel,
    SimulatedEngine,
    SimulatedUpdater,
    TurnBank,
    Workload,
    write_model,
)
from ragr1.services.common.config import flags  # noqa: E402
from ragr1.services.common.process import ServiceProcess  # noqa: E402
from ragr1.services.common.redis_server import RedisServer  # noqa: E402

STATS_SECONDS = 1.0
SAMPLE_SECONDS = 0.2
# Log-spaced latency buckets (0.1 ms to 100 s, 5% apart) for the search calls' percentiles.
_BUCKETS = [1e-4 * 1.05**k for k in range(284)]


# -- one run's settings ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class RunSpec:
    """Everything a run's processes need, written to a file they read."""

    replicas: int
    max_num_seqs: int
    max_in_flight: int
    replicas_per_process: int
    samples: int
    batch_size: int
    max_staleness: int
    ppo_seconds: float
    weight_load_seconds: float
    search_delay_seconds: float
    latency: dict[str, Any]
    workload: dict[str, Any]
    kv_cache_tokens: int
    max_turns: int
    max_tokens_per_turn: int
    tokens_per_query: int
    max_model_len: int
    redis_url: str
    router: str
    reward: str
    model_dir: str
    tokenizer_dir: str
    run_dir: str
    seed: int

    @property
    def model(self) -> LatencyModel:
        return LatencyModel(**self.latency)

    @property
    def work(self) -> Workload:
        return Workload(**self.workload)

    def processes(self) -> list[list[str]]:
        """The replica names of each worker process."""
        names = [f"replica-{i}" for i in range(self.replicas)]
        return [names[i:i + self.replicas_per_process] for i in range(0, len(names), self.replicas_per_process)]

    def policy_settings(self, name: str) -> dict[str, Any]:
        """The replica's ``PolicyConfig`` settings (the policy server's own, as a deployment passes them)."""
        return {
            "worker": True, "worker_name": name, "redis_url": self.redis_url, "retriever_address": self.router,
            "reward_address": self.reward, "max_num_seqs": self.max_num_seqs, "max_in_flight": self.max_in_flight,
            "max_turns": self.max_turns, "max_tokens_per_turn": self.max_tokens_per_turn,
            "tokens_per_query": self.tokens_per_query, "max_model_len": self.max_model_len, "model": self.model_dir,
            "grace_seconds": 5.0,
            # Slowed with the engines: a prompt in progress longer than this is taken for abandoned.
            "reclaim_idle_ms": round(policy_default("reclaim_idle_ms") * self.model.slowdown),
        }


def policy_default(name: str) -> Any:
    """A setting's default in the policy's config (the rig scales some with its slowdown)."""
    from ragr1.services.policy.config import PolicyConfig

    (field,) = [f for f in dataclasses.fields(PolicyConfig) if f.name == name]
    return field.default


class LatencyHistogram:
    """Counts of durations in ``_BUCKETS``; percentiles of the difference of two reads."""

    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS) + 1)

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(_BUCKETS, seconds)] += 1


def percentile(counts: Sequence[int], q: float) -> float:
    total = sum(counts)
    if not total:
        return math.nan
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return _BUCKETS[min(i, len(_BUCKETS) - 1)]
    return _BUCKETS[-1]


class TimedSearch:
    """The replica's ``RetrieverSearch`` with ``delay`` seconds added to each call first (a larger index's latency,
    set per run), and each call's own time (the router's, over gRPC) counted."""

    def __init__(self, search: Any, delay: float, histogram: LatencyHistogram) -> None:
        self.search_backend = search
        self.delay = delay
        self.histogram = histogram

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> Any:
        if self.delay:
            await asyncio.sleep(self.delay)
        start = time.perf_counter()
        try:
            return await self.search_backend.search(queries, groups)
        finally:
            self.histogram.add(time.perf_counter() - start)

    async def close(self) -> None:
        await self.search_backend.close()


def turn_bank(tokenizer: Any, seed: int) -> TurnBank:
    """Queries that the router has to embed afresh (a passage title and a word of another passage: the query
    cache does not answer them), thinking text from the corpus, answers from the training sets."""
    from ragr1.shipped import TRAIN_SETS, corpus_path, read_jsonl, train_path

    rng = random.Random(seed)
    passages = list(read_jsonl(corpus_path(), limit=4000))
    words = sorted({w for p in passages[:400] for w in re.findall(r"[A-Za-z]{4,}", p["text"])})
    queries = [f"{p['title']} {rng.choice(words)}" for p in rng.sample(passages, 2000)]
    filler = " ".join(p["text"] for p in passages[:40])
    answers = [a for name in TRAIN_SETS for r in read_jsonl(train_path(name)) for a in r["golden_answers"][:1]]
    return TurnBank(tokenizer, queries, filler, rng.sample(answers, 500))


# -- a worker process: replicas as the policy server wires them ---------------------------------------------------
@dataclasses.dataclass
class Replica:
    name: str
    engine: SimulatedEngine
    worker: Any
    follower: Any
    policy: Any
    search: TimedSearch
    scorer: Any
    samples: int = 0
    closed: int = 0
    in_flight: int = 0


async def no_health(serving: bool) -> None:
    """A rig replica serves no gRPC: the follower's health switch has nothing to switch."""


def build_replica(spec: RunSpec, name: str, tokenizer: Any, bank: TurnBank, histogram: LatencyHistogram,
                  seed: int) -> Replica:
    from ragr1.services.policy.agent import Sampling
    from ragr1.services.policy.backends import RetrieverSearch, RewardServiceScorer
    from ragr1.services.policy.config import PolicyConfig
    from ragr1.services.policy.follower import WeightFollower
    from ragr1.services.policy.runtime import Policy
    from ragr1.services.policy.server import build_worker

    config = PolicyConfig(**spec.policy_settings(name))
    config.validate()
    engine = SimulatedEngine(spec.model, spec.work, bank, max_num_seqs=config.max_num_seqs,
                             kv_cache_tokens=spec.kv_cache_tokens, weight_load_seconds=spec.weight_load_seconds,
                             seed=seed)
    search = TimedSearch(RetrieverSearch(config.retriever_address, top_k=config.top_k,
                                         timeout=config.retrieval_timeout_seconds,
                                         dedup_within_group=config.dedup_within_group),
                         spec.search_delay_seconds, histogram)
    scorer = RewardServiceScorer(config.reward_address)
    policy = Policy(engine, tokenizer, search, config, model_dir=Path(spec.model_dir),
                    default_sampling=Sampling.of(config), limits=config, on_weight_update=config.weight_update_policy(),
                    engine_seed=config.seed, schedule=config)
    client = config.redis_client()
    follower = WeightFollower(policy, client, name, config.follower_settings(), set_serving=no_health)
    worker = build_worker(config, policy, scorer, client, name, follower.accepting, engine=engine)
    return Replica(name, engine, worker, follower, policy, search, scorer)


def replica_stats(r: Replica) -> dict[str, Any]:
    return {"engine": dataclasses.asdict(r.engine.stats), "samples": r.samples, "gate_closed": r.closed,
            "in_flight": r.in_flight, "max_in_flight": r.worker.max_in_flight, "version": r.policy.gate.version}


def rig_tokenizer(directory: str) -> Any:
    # The class AutoTokenizer gives for this model, without the torch import its model lookup brings (500 MB
    # per process).
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(directory)


def header_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The tensors of a checkpoint's safetensors files and their shapes, from the files' JSON headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        with open(file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        shapes.update({name: tuple(v["shape"]) for name, v in header.items() if name != "__metadata__"})
    return shapes


class Fleet:
    """Replicas of one process (their workers and weight followers running) until ``stop``."""

    def __init__(self, spec: RunSpec, names: Sequence[str], tokenizer: Any) -> None:
        from ragr1.services.policy import weights

        # The policy's check of a new checkpoint reads its tensors' shapes through torch, which a replica has
        # loaded with vLLM; a rig worker process has not, and would import it (seconds, 300 MB) at the first
        # weight version. The same names and shapes, from the files' headers.
        weights._tensor_shapes = header_shapes
        index = int(names[0].rsplit("-", 1)[1])
        bank = turn_bank(tokenizer, spec.seed + index)
        self.histogram = LatencyHistogram()
        self.replicas = [build_replica(spec, name, tokenizer, bank, self.histogram, spec.seed + 1000 * (index + i))
                         for i, name in enumerate(names)]
        self._stops = [asyncio.Event() for _ in self.replicas]
        self._running: list[asyncio.Future[Any]] = []

    def start(self) -> None:
        self._running = [asyncio.ensure_future(work) for r, s in zip(self.replicas, self._stops, strict=True)
                         for work in (r.worker.run(s), r.follower.run(s))]

    def sample(self) -> None:
        for r in self.replicas:
            r.samples += 1
            r.closed += not r.policy.gate._open.is_set()
            r.in_flight += r.worker.in_flight

    async def stop(self) -> None:
        for s in self._stops:
            s.set()
        await asyncio.wait(self._running, timeout=10)
        for r in self.replicas:
            await r.search.close()
            await r.scorer.close()


async def serve_replicas(spec: RunSpec, names: Sequence[str], stats_path: Path, stop: asyncio.Event) -> None:
    """The replicas of one worker process until ``stop``; their totals written to ``stats_path`` every second."""
    fleet = Fleet(spec, names, rig_tokenizer(spec.tokenizer_dir))
    fleet.start()

    def write() -> None:
        body = {"pid": os.getpid(), "time": time.monotonic(),
                "replicas": {r.name: replica_stats(r) for r in fleet.replicas}, "search": fleet.histogram.counts}
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(stats_path)

    next_write = time.monotonic()
    while not stop.is_set():
        fleet.sample()
        if time.monotonic() >= next_write:
            write()
            next_write += STATS_SECONDS
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)
    await fleet.stop()
    write()


@dataclasses.dataclass
class Fill:
    """One replica, sampled while prompts waited for a worker, its weights were not being changed (the version
    fence holds new trajectories back then, by design) and its worker held fewer than twice its engine's batch
    (at that bound every further trajectory would wait on the retriever: the engine's idleness is the
    retriever's): how often, the places of its engine's batch that no trajectory of its worker held outside a
    search (summed over the samples), and how often its engine held no request."""

    batch: int
    waited: int = 0
    short: int = 0
    idle: int = 0

    @property
    def short_share(self) -> float:
        return self.short / max(1, self.waited * self.batch)

    @property
    def idle_share(self) -> float:
        return self.idle / max(1, self.waited)


def prompts_waiting(client: Any) -> int:
    return _waiting(client)


async def measure_fill(spec: RunSpec, tokenizer: Any, seconds: float, period: float = 0.05) -> dict[str, Fill]:
    """A small rig in this process: the replicas of ``spec`` and the trainer's consuming side (in a thread), for
    ``seconds`` after every engine has had its first request; each replica's ``Fill``."""
    import threading

    import redis

    trainer = trainer_loop(spec)
    trainer.steps.plot = lambda *args, **kwargs: None
    fleet = Fleet(spec, [f"replica-{i}" for i in range(spec.replicas)], tokenizer)
    fleet.start()
    thread = threading.Thread(target=trainer.run, name="trainer", daemon=True)
    thread.start()
    client = redis.Redis.from_url(spec.redis_url)
    fills = {r.name: Fill(r.engine.max_num_seqs) for r in fleet.replicas}
    try:
        deadline = time.monotonic() + 60
        while any(r.engine.stats.requests == 0 for r in fleet.replicas):
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the engines got no request in 60 s")
            await asyncio.sleep(period)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            waiting = await asyncio.to_thread(prompts_waiting, client)
            for r in fleet.replicas:
                fill = fills[r.name]
                running = r.worker.in_flight
                if waiting and r.policy.gate._open.is_set() and running < 2 * fill.batch:
                    fill.waited += 1
                    fill.short += max(0, fill.batch - (running - min(running, r.policy.loop.searching)))
                    fill.idle += r.engine.running == 0
            await asyncio.sleep(period)
    finally:
        await fleet.stop()
        trainer.stop_event.set()
        await asyncio.to_thread(thread.join, 60)
        client.close()
    return fills


def worker_main(spec: RunSpec, process: int) -> None:
    names = spec.processes()[process]
    stats = Path(spec.run_dir) / f"worker-{process}.json"

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_replicas(spec, names, stats, stop)

    asyncio.run(run())


# -- the trainer's consuming side ----------------------------------------------------------------------------------
def trainer_loop(spec: RunSpec) -> Any:
    """``PPOLoop`` as `ragr1 train ppo` builds it, with the PPO step simulated."""
    from ragr1.services.trainer.checkpoint import Checkpointer
    from ragr1.services.trainer.config import PPOConfig
    from ragr1.services.trainer.data import load_qa_tasks
    from ragr1.services.trainer.loop import PPOLoop, TrainerStatus
    from ragr1.services.trainer.publisher import WeightPublisher
    from ragr1.services.trainer.steplog import StepLog
    from ragr1.shipped import TRAIN_SETS, train_path

    out = Path(spec.run_dir) / "trainer"
    config = PPOConfig(redis_url=spec.redis_url, model=spec.model_dir, output_dir=str(out),
                       samples_per_prompt=spec.samples, batch_size=spec.batch_size, mini_batch_size=spec.batch_size,
                       max_staleness=spec.max_staleness, max_updates=0, poll_ms=200)
    config.validate()
    tasks = [t for name in TRAIN_SETS for t in load_qa_tasks(train_path(name), "multi")]
    client = config.redis_client()
    return PPOLoop(config, client, tasks, SimulatedUpdater(spec.ppo_seconds, Path(spec.model_dir)),
                   Checkpointer(out / "checkpoints", config.keep_checkpoints), StepLog(out / "steps.jsonl"),
                   WeightPublisher(client, config.weights_timeout_seconds), TrainerStatus())


def trainer_main(spec: RunSpec) -> None:
    loop = trainer_loop(spec)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop_event.set())
    # The run ends with SIGTERM; its curves are not wanted.
    loop.steps.plot = lambda *args, **kwargs: None
    loop.run()


def role_main(args: argparse.Namespace) -> None:
    from ragr1.services.common import lifeline

    lifeline.watch()
    spec = RunSpec(**json.loads(Path(args.spec).read_text()))
    profile = cProfile.Profile() if args.cprofile else None
    if profile is not None:
        profile.enable()
    try:
        if args.role == "worker":
            worker_main(spec, args.process)
        else:
            trainer_main(spec)
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.cprofile)


# -- the orchestrator ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Services:
    redis: RedisServer
    router: ServiceProcess
    shards: list[ServiceProcess]
    reward: ServiceProcess
    router_metrics: str
    passages: int


@contextlib.contextmanager
def services(root: Path, args: argparse.Namespace) -> Iterator[Services]:
    from ragr1.services.retriever.config import RouterConfig, ShardConfig
    from ragr1.stack.config import StackConfig
    from ragr1.stack.index_cache import ensure_index

    stack = StackConfig()
    index = ensure_index(args.passages, args.shards, stack.index_type, stack.max_passage_tokens)
    passages = json.loads((index / "manifest.json").read_text()).get("num_passages", args.passages)
    profile = {role: ["-m", "cProfile", "-o", str(root / f"{role}.prof")] for role in ("router", "reward", "shard")
               if role in args.profile}

    def ragr1(name: str, argv: list[str], role: str = "") -> ServiceProcess:
        command = [sys.executable, *profile.get(role, []), "-m", "ragr1", *argv]
        return ServiceProcess(name, command, None, root / f"{name}.log", start_timeout=300)

    shards = [ragr1(f"shard-{i}", ["serve", "retriever-shard", *flags(ShardConfig, {
        "index": str(index), "shard": i, "port": 0, "metrics_port": 0, "search_threads": args.retriever_threads})],
        "shard" if i == 0 else "") for i in range(args.shards)]
    with RedisServer() as redis_server, contextlib.ExitStack() as stack_:
        for s in shards:
            s.launch()
        for s in shards:
            stack_.callback(s.stop)
            s.wait_started()
        router = ragr1("router", ["serve", "retriever", *flags(RouterConfig, {
            "index": str(index), "shards": [s.target for s in shards], "port": 0, "metrics_port": 0,
            "http_port": -1, "encoder_threads": args.retriever_threads})], "router")
        reward = ragr1("reward", ["serve", "reward", "--port", "0", "--metrics-port", "0"], "reward")
        for s in (router, reward):
            s.launch()
        for s in (router, reward):
            stack_.callback(s.stop)
            s.wait_started()
        metrics = router.wait_ready(10)["metrics"]
        yield Services(redis_server, router, shards, reward, f"http://127.0.0.1:{metrics}/metrics", int(passages))


def model_files(root: Path) -> tuple[Path, Path]:
    """The tokenizer's directory (SmolLM2's) and a served model the replicas check checkpoints against: its
    config and one tiny tensor (the simulated engine loads nothing)."""
    from ragr1.model_paths import prepare_policy_model

    tokenizer = prepare_policy_model()
    return tokenizer, write_model(root / "model", tokenizer / CONFIG, 0.0)


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def rss_mb(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss / 2**20
    return total


def router_searches(url: str) -> tuple[list[float], list[float]]:
    """The router's ``ragr1_retriever_search_seconds`` histogram (gRPC calls): its bounds and cumulative counts."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    rows = re.findall(r'^ragr1_retriever_search_seconds_bucket\{le="([^"]+)",transport="grpc"\} (\S+)$', text, re.M)
    return [float(b) for b, _ in rows], [float(c) for _, c in rows]


@dataclasses.dataclass
class Rig:
    spec: RunSpec
    services: Services
    workers: list[ServiceProcess]
    trainer: ServiceProcess | None = None

    def pids(self) -> dict[str, list[int]]:
        s = self.services
        out = {
            "worker": [w.process.pid for w in self.workers if w.process],
            "router": [s.router.process.pid] if s.router.process else [],
            "shards": [p.process.pid for p in s.shards if p.process],
            "reward": [s.reward.process.pid] if s.reward.process else [],
            "trainer intake": [self.trainer.process.pid] if self.trainer and self.trainer.process else [],
            "redis": [s.redis.process.pid] if s.redis.process else [],
        }
        return out

    def __post_init__(self) -> None:
        # One connection for the rig's own reads (a new one per read would add its HELLO to the counts).
        self.client = self.services.redis.client()

    def snapshot(self) -> dict[str, Any]:
        client = self.client
        commands = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}
        stats = client.info("stats")
        rollouts = _added(client, "rollouts")
        waiting = _waiting(client)
        workers = [json.loads(p.read_text()) for p in sorted(Path(self.spec.run_dir).glob("worker-*.json"))]
        steps = Path(self.spec.run_dir) / "trainer" / "steps.jsonl"
        records = [json.loads(line) for line in steps.read_text().splitlines()] if steps.exists() else []
        pids = self.pids()
        return {
            "time": time.monotonic(), "cpu": {role: cpu_seconds(p) for role, p in pids.items()},
            "rss": {role: rss_mb(p) for role, p in pids.items()}, "commands": commands,
            "net_in": int(stats["total_net_input_bytes"]), "net_out": int(stats["total_net_output_bytes"]),
            "rollouts": rollouts, "waiting": waiting, "workers": workers, "steps": records,
            "router": router_searches(self.services.router_metrics),
        }

    def rollouts(self) -> int:
        return _added(self.client, "rollouts")


def _added(client: Any, stream: str) -> int:
    try:
        return int(client.xinfo_stream(stream)["entries-added"])
    except Exception:  # not created yet
        return 0


def _waiting(client: Any) -> int:
    """Prompts admitted that no worker has taken (the rig's own read: XINFO GROUPS's lag)."""
    try:
        groups = client.xinfo_groups("prompts")
    except Exception:
        return 0
    lags = [g.get("lag") for g in groups if g["name"] in (b"rollout-workers", "rollout-workers")]
    return int(lags[0] or 0) if lags else 0


# The rig's own Redis reads, left out of the per-rollout counts.
RIG_COMMANDS = {"info", "xinfo|stream", "xinfo|groups", "flushall", "config|resetstat", "ping"}


def engine_totals(snapshot: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for process in snapshot["workers"]:
        for r in process["replicas"].values():
            for k, v in r["engine"].items():
                out[k] = out.get(k, 0.0) + v
            for k in ("samples", "gate_closed", "in_flight"):
                out[k] = out.get(k, 0.0) + r[k]
    return out


def search_counts(snapshot: dict[str, Any]) -> list[int]:
    counts = [0] * (len(_BUCKETS) + 1)
    for process in snapshot["workers"]:
        counts = [a + b for a, b in zip(counts, process["search"], strict=True)]
    return counts


def measure(a: dict[str, Any], b: dict[str, Any], spec: RunSpec, batch: int, idle: dict[str, float]
            ) -> dict[str, Any]:
    """The figures of the window between snapshots ``a`` and ``b``."""
    seconds = b["time"] - a["time"]
    n = b["rollouts"] - a["rollouts"]
    ea, eb = engine_totals(a), engine_totals(b)
    tokens = eb["tokens"] - ea["tokens"]
    model = spec.model
    ceiling_tokens = spec.replicas * model.tokens_per_second(batch)
    per_trajectory = tokens / max(n, 1)
    cpu = {role: b["cpu"][role] - a["cpu"].get(role, 0.0) for role in b["cpu"]}
    sim_cpu = eb["cpu_seconds"] - ea["cpu_seconds"]
    commands = {k: b["commands"].get(k, 0) - a["commands"].get(k, 0) for k in b["commands"]}
    commands = {k: v for k, v in commands.items() if v and k not in RIG_COMMANDS}
    steps = [r for r in b["steps"] if r["step"] > (a["steps"][-1]["step"] if a["steps"] else 0)]
    searches = search_counts(b)
    searches = [x - y for x, y in zip(searches, search_counts(a), strict=True)]
    bounds = b["router"][0]
    routed = [x - y for x, y in zip(b["router"][1], a["router"][1], strict=True)]
    samples = max(1.0, eb["samples"] - ea["samples"])
    return {
        "replicas": spec.replicas, "max_num_seqs": spec.max_num_seqs, "batch": batch,
        "max_in_flight": spec.max_in_flight, "slowdown": model.slowdown, "seconds": seconds, "trajectories": n,
        "trajectories_per_second": n / seconds,
        "ceiling_trajectories_per_second": ceiling_tokens / per_trajectory,
        "tokens_per_second": tokens / seconds, "ceiling_tokens_per_second": ceiling_tokens,
        "of_ceiling": tokens / seconds / ceiling_tokens,
        "engine_fill": (eb["request_seconds"] - ea["request_seconds"]) / (spec.replicas * batch * seconds),
        "engine_idle": (eb["idle_seconds"] - ea["idle_seconds"]) / (spec.replicas * seconds),
        "engine_queue": (eb["waiting_seconds"] - ea["waiting_seconds"]) / (spec.replicas * seconds),
        "gate_closed": (eb["gate_closed"] - ea["gate_closed"]) / samples,
        "in_flight_per_replica": (eb["in_flight"] - ea["in_flight"]) / samples,
        "generated_tokens_per_trajectory": per_trajectory,
        "cpu_ms_per_trajectory": {role: 1000 * v / max(n, 1) for role, v in cpu.items()},
        "cpu_ms_per_trajectory_net_of_idle": {
            role: 1000 * (v - idle.get(role, 0.0) * seconds) / max(n, 1) for role, v in cpu.items()},
        "simulated_engine_cpu_ms_per_trajectory": 1000 * sim_cpu / max(n, 1),
        "cores": {role: v / seconds for role, v in cpu.items()},
        "rss_mb": b["rss"],
        "redis_commands_per_rollout": {k: v / max(n, 1) for k, v in sorted(commands.items(), key=lambda kv: -kv[1])},
        "redis_bytes_in_per_rollout": (b["net_in"] - a["net_in"]) / max(n, 1),
        "redis_bytes_out_per_rollout": (b["net_out"] - a["net_out"]) / max(n, 1),
        "updates": len(steps),
        "trainer_wait_seconds": [r["queue_seconds"] for r in steps],
        "prompts_waiting_at_end": b["waiting"],
        "searches_per_second": sum(searches) / seconds,
        "search_p50_ms": 1000 * percentile(searches, 0.5), "search_p99_ms": 1000 * percentile(searches, 0.99),
        "router_calls_per_second": (routed[-1] if routed else 0.0) / seconds,
        "router_p99_ms": 1000 * bucket_percentile(routed, bounds, 0.99),
    }


def bucket_percentile(cumulative: Sequence[float], bounds: Sequence[float], q: float) -> float:
    """A Prometheus histogram's percentile, interpolated within its bucket."""
    if not cumulative or not cumulative[-1]:
        return math.nan
    rank = q * cumulative[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=False):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def launch(name: str, argv: list[str], root: Path) -> ServiceProcess:
    process = ServiceProcess(name, [sys.executable, str(Path(__file__).resolve()), *argv], None, root / f"{name}.log")
    return process.launch()


def wait_for(condition: Any, timeout: float, what: str, rig: Rig | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if rig is not None:
            for p in [*rig.workers, *([rig.trainer] if rig.trainer else [])]:
                if p.process is not None and p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}:\n{p.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.5)


def expected_lifetime(spec: RunSpec, batch: int) -> float:
    """Seconds one trajectory takes with its engine full: its turns' tokens at the batch's step time, and its
    searches' added delay."""
    work = spec.work
    turns = work.expected_turns(spec.max_turns)
    return turns * work.tokens_per_turn * spec.model.step_seconds(batch) + (turns - 1) * spec.search_delay_seconds


def run_one(args: argparse.Namespace, services_: Services, root: Path, tokenizer: Path, model_dir: Path,
            replicas: int, size: int) -> dict[str, Any]:
    from ragr1.services.policy.config import PolicyConfig
    from ragr1.services.policy.streaming import resolve_max_in_flight

    run_dir = root / f"r{replicas}-s{size}"
    run_dir.mkdir()
    client = services_.redis.client()
    client.flushall()
    client.config_resetstat()
    client.close()
    work = Workload(args.tokens_per_turn, args.search_probability, 3)
    unslowed = dataclasses.replace(H100_LLAMA_8B, base_ms=args.model_base_ms, per_seq_ms=args.model_per_seq_ms)
    policy = PolicyConfig(max_num_seqs=size, max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn,
                          tokens_per_query=args.tokens_per_query, max_model_len=args.max_model_len)
    batch = size if args.kv_cache_tokens <= 0 else max(1, min(size, args.kv_cache_tokens // policy.trajectory_tokens()))
    tokens_per_trajectory = work.expected_turns(args.max_turns) * work.tokens_per_turn
    natural = replicas * unslowed.tokens_per_second(batch) / tokens_per_trajectory
    slowdown = args.slowdown or max(1.0, natural / args.rate)
    model = dataclasses.replace(unslowed, slowdown=slowdown)
    in_flight = resolve_max_in_flight(args.max_in_flight, batch)
    batch_size = math.ceil(args.batch_fleets * replicas * in_flight / args.samples) * args.samples
    ceiling_rate = natural / slowdown
    spec = RunSpec(
        replicas=replicas, max_num_seqs=size, max_in_flight=args.max_in_flight,
        replicas_per_process=args.replicas_per_process or math.ceil(replicas / args.worker_processes),
        samples=args.samples, batch_size=batch_size,
        max_staleness=1, ppo_seconds=args.ppo_share * batch_size / ceiling_rate,
        weight_load_seconds=args.weight_load_seconds * slowdown, search_delay_seconds=args.search_ms / 1000 * slowdown,
        latency=dataclasses.asdict(model), workload=dataclasses.asdict(work), kv_cache_tokens=args.kv_cache_tokens,
        max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn, tokens_per_query=args.tokens_per_query,
        max_model_len=args.max_model_len, redis_url=services_.redis.url, router=services_.router.target or "",
        reward=services_.reward.target or "", model_dir=str(model_dir), tokenizer_dir=str(tokenizer),
        run_dir=str(run_dir), seed=args.seed,
    )
    spec_file = run_dir / "spec.json"
    spec_file.write_text(json.dumps(dataclasses.asdict(spec), indent=1))
    lifetime = expected_lifetime(spec, batch)
    setting = args.max_in_flight or "0: the engine batch"
    print(f"\n== {replicas} replicas x engine batch {size} (max_in_flight {setting}), {spec.replicas_per_process} "
          f"per worker process:"
          f" slowdown x{slowdown:.2f} (natural ceiling {natural:.1f} trajectories/s), simulated ceiling "
          f"{ceiling_rate:.2f} trajectories/s, a trajectory ~{lifetime:.0f} s at a full batch; PPO step (simulated) "
          f"{spec.ppo_seconds:.1f} s per {batch_size} rollouts; weight load (simulated) "
          f"{spec.weight_load_seconds:.1f} s", flush=True)

    def profiled(role: str, first: bool) -> list[str]:
        return ["--cprofile", str(root / f"{role}.prof")] if role in args.profile and first else []

    workers = [launch(f"{run_dir.name}-worker-{i}", ["--role", "worker", "--spec", str(spec_file), "--process", str(i),
                                                     *profiled("worker", i == 0)], run_dir)
               for i in range(len(spec.processes()))]
    rig = Rig(spec, services_, workers)
    try:
        wait_for(lambda: len(list(run_dir.glob("worker-*.json"))) == len(workers), 600, "the workers' start", rig)
        idle_a = rig.snapshot()
        time.sleep(args.idle_seconds)
        idle_b = rig.snapshot()
        idle = {role: (idle_b["cpu"][role] - idle_a["cpu"][role]) / (idle_b["time"] - idle_a["time"])
                for role in idle_b["cpu"]}
        rig.trainer = launch(f"{run_dir.name}-trainer", ["--role", "trainer", "--spec", str(spec_file),
                                                         *profiled("trainer", True)], run_dir)
        warm = max(args.min_trajectories // 2, round(replicas * in_flight * args.warmup_lifetimes))
        wait_for(lambda: rig.rollouts() >= warm, max(600, 20 * lifetime), "the warm-up", rig)
        a = rig.snapshot()
        want = max(args.min_trajectories, round(replicas * in_flight * args.measure_lifetimes))
        deadline = time.monotonic() + args.max_measure_seconds
        wait_for(lambda: rig.rollouts() - a["rollouts"] >= want or time.monotonic() > deadline,
                 args.max_measure_seconds + 60, "the measurement", rig)
        b = rig.snapshot()
        result = measure(a, b, spec, batch, idle)
        result["idle_cores"] = idle
        result["model"] = model.describe()
        result["passages"] = services_.passages
        result["search_delay_ms"] = spec.search_delay_seconds * 1000
        result["ppo_seconds"] = spec.ppo_seconds
        result["batch_size"] = batch_size
        return result
    finally:
        for p in [*([rig.trainer] if rig.trainer else []), *workers]:
            p.stop(timeout=20)
        rig.client.close()


ROLES = ("worker", "router", "shards", "reward", "trainer intake", "redis")


def print_result(r: dict[str, Any]) -> None:
    cpu = r["cpu_ms_per_trajectory"]
    print(f"  {r['trajectories']} trajectories in {r['seconds']:.0f} s: {r['trajectories_per_second']:.2f}/s against a "
          f"simulated ceiling of {r['ceiling_trajectories_per_second']:.2f}/s ({r['of_ceiling']:.0%} of the simulated "
          f"engines' tokens/s); engine fill {r['engine_fill']:.0%}, idle {r['engine_idle']:.0%}, weight fence closed "
          f"{r['gate_closed']:.0%}; in flight per replica {r['in_flight_per_replica']:.1f}; "
          f"{r['generated_tokens_per_trajectory']:.0f} generated tokens per trajectory")
    print("  CPU ms per trajectory: " + ", ".join(f"{role} {cpu.get(role, 0):.1f}" for role in ROLES)
          + f" (of the worker's, the simulated engine's own {r['simulated_engine_cpu_ms_per_trajectory']:.1f})")
    net = r["cpu_ms_per_trajectory_net_of_idle"]
    print("  net of the idle rate: " + ", ".join(f"{role} {net.get(role, 0):.1f}" for role in ROLES))
    print("  cores busy: " + ", ".join(f"{role} {r['cores'].get(role, 0):.2f}" for role in ROLES)
          + "; RSS MB: " + ", ".join(f"{role} {r['rss_mb'].get(role, 0):.0f}" for role in ROLES))
    top = list(r["redis_commands_per_rollout"].items())[:8]
    print(f"  Redis per rollout: {sum(r['redis_commands_per_rollout'].values()):.1f} commands ("
          + ", ".join(f"{k} {v:.2f}" for k, v in top) + f"), {r['redis_bytes_in_per_rollout'] / 1024:.1f} KiB in, "
          f"{r['redis_bytes_out_per_rollout'] / 1024:.1f} KiB out")
    waits = r["trainer_wait_seconds"]
    waited = ", ".join(f"{w:.1f}" for w in waits) or "-"
    print(f"  trainer: {r['updates']} updates, waited {waited} s for its batches; searches "
          f"{r['searches_per_second']:.1f}/s, p50 {r['search_p50_ms']:.1f} ms, p99 {r['search_p99_ms']:.1f} ms "
          f"(router's histogram p99 {r['router_p99_ms']:.1f} ms)", flush=True)


def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Stopped, the run's processes and files go as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"{header()}; engines and PPO step SIMULATED (bench/fleet/simulated.py)")
    results = []
    with tempfile.TemporaryDirectory(prefix="scale-rig-") as tmp:
        root = Path(tmp)
        tokenizer, model_dir = model_files(root)
        with services(root, args) as services_:
            threads = args.retriever_threads or "all"
            print(f"retriever: {args.shards} shards over {services_.passages} passages, {threads} "
                  f"thread(s) per shard and for the router's encoder; added search delay "
                  f"{args.search_ms:g} ms (before the slowdown); samples per prompt {args.samples}; "
                  f"{args.tokens_per_turn} tokens per turn, search probability {args.search_probability}", flush=True)
            for replicas in args.replicas:
                for size in args.sizes:
                    result = run_one(args, services_, root, tokenizer, model_dir, replicas, size)
                    result["load_average"] = os.getloadavg()[0]
                    print_result(result)
                    results.append(result)
                    if args.out:
                        Path(args.out).write_text(json.dumps(results, indent=1))
        if args.profile:
            for prof in root.glob("*.prof"):
                print(f"\n== profile {prof.name}")
                pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(40)
                pstats.Stats(str(prof)).sort_stats("tottime").print_stats(30)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("| replicas | batch | in flight | slowdown | trajectories/s | simulated ceiling | of ceiling | engine fill | "
          "worker | router | shards | reward | trainer intake | redis | Redis cmds/rollout | trainer wait s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r["cpu_ms_per_trajectory"]
        waits = r["trainer_wait_seconds"]
        print(f"| {r['replicas']} | {r['batch']} | {r['in_flight_per_replica']:.0f} | x{r['slowdown']:.2f} | "
              f"{r['trajectories_per_second']:.2f} | {r['ceiling_trajectories_per_second']:.2f} | "
              f"{r['of_ceiling']:.0%} | "
              f"{r['engine_fill']:.0%} | " + " | ".join(f"{c.get(role, 0):.1f}" for role in ROLES)
              + f" | {sum(r['redis_commands_per_rollout'].values()):.1f} | "
              f"{(sum(waits) / len(waits)) if waits else float('nan'):.1f} |")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256], help="each engine's max_num_seqs")
    p.add_argument("--max-in-flight", type=int, default=0, help="the workers' setting (0: the product's default)")
    p.add_argument("--worker-processes", type=int, default=4,
                   help="worker processes at most, the replicas shared among them (a cluster runs one per replica; "
                   "this machine's memory holds a few)")
    p.add_argument("--replicas-per-process", type=int, default=0, help="instead of --worker-processes")
    p.add_argument("--rate", type=float, default=12.0,
                   help="the fleet's simulated ceiling, trajectories/s, that the slowdown brings it to (at most)")
    p.add_argument("--slowdown", type=float, default=0.0, help="a fixed slowdown instead of --rate")
    p.add_argument("--model-base-ms", type=float, default=H100_LLAMA_8B.base_ms)
    p.add_argument("--model-per-seq-ms", type=float, default=H100_LLAMA_8B.per_seq_ms)
    p.add_argument("--tokens-per-turn", type=int, default=150)
    p.add_argument("--search-probability", type=float, default=0.75)
    p.add_argument("--search-ms", type=float, default=0.0, help="added to each search call (before the slowdown)")
    p.add_argument("--passages", type=int, default=0, help="index the first N shipped passages; 0: all")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--samples", type=int, default=5, help="samples per prompt (a group)")
    p.add_argument("--kv-cache-tokens", type=int, default=0, help="each engine's KV cache; 0: unlimited")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-tokens-per-turn", type=int, default=256)
    p.add_argument("--tokens-per-query", type=int, default=480)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--batch-fleets", type=float, default=4.0,
                   help="rollouts per update, in trajectories the fleet has in flight (RAG-R1: 512 prompts x 5 "
                   "samples per update, several times what its rollout GPUs run at once)")
    p.add_argument("--retriever-threads", type=int, default=1,
                   help="the shards' FAISS and the router's encoder threads (1: the settings' advice for a shared "
                   "CPU; 0: all cores)")
    p.add_argument("--ppo-share", type=float, default=0.25,
                   help="the simulated PPO step lasts this share of the time the fleet takes to make a batch")
    p.add_argument("--weight-load-seconds", type=float, default=2.0, help="simulated, before the slowdown")
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--warmup-lifetimes", type=float, default=1.0)
    p.add_argument("--measure-lifetimes", type=float, default=2.0)
    p.add_argument("--min-trajectories", type=int, default=150)
    p.add_argument("--max-measure-seconds", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", nargs="*", choices=["worker", "trainer", "router", "reward", "shard"], default=[],
                   help="run the first process of these roles under cProfile and print their top functions")
    p.add_argument("--out", default="")
    # A role process (started by the orchestrator).
    p.add_argument("--role", choices=["worker", "trainer"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="", help=argparse.SUPPRESS)
    p.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cprofile", default="", help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    parsed = parser().parse_args()
    if parsed.role:
        role_main(parsed)
    else:
        main(parsed)
