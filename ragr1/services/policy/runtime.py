"""The policy: the engine, the agent loop and the weight version, with input checks and metrics.

Everything the servicer and the rollout worker call; no gRPC here. Errors are
``ragr1.services.common.errors`` exceptions, which the server maps to status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ragr1.protocol.information import Passage
from ragr1.protocol.prompts import Tokenizer, chat_prompt_ids
from ragr1.services.common.config import Validated, check_at_least, setting
from ragr1.services.common.errors import FailedPrecondition, InvalidArgument
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.policy import metrics
from ragr1.services.policy.activity import Busy, Window
from ragr1.services.policy.agent import (
    AgentLoop,
    Engine,
    Generation,
    GenerationRequest,
    LoopConfig,
    Sampling,
    SearchBackend,
    Task,
    Trajectory,
    sample_indexes,
)
from ragr1.services.policy.weights import InFlight, VersionGate, check_checkpoint

log = logging.getLogger(__name__)

# The window of the tokens/s and retrieval-share gauges: several groups' ends, so that a replica running many
# at once reads as its whole rate, yet recent enough to follow a change of load.
RATE_WINDOW_SECONDS = 60.0


class _TimedSearch:
    """The search backend, its calls counted into ``busy`` (the time at least one search is outstanding)."""

    def __init__(self, inner: SearchBackend, busy: Busy) -> None:
        self.inner = inner
        self.busy = busy

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        self.busy.begin()
        try:
            return await self.inner.search(queries, groups)
        finally:
            self.busy.end()


class ReloadableEngine(Engine, Protocol):
    async def abort_all(self) -> None: ...

    async def reload_weights(self, checkpoint: Path) -> None: ...


@dataclasses.dataclass
class RolloutLimits(Validated):
    """What one request may ask for (the policy's config is one)."""

    max_batch: int = setting(64, "most tasks or prompts per request")
    max_question_chars: int = setting(4096, "longest question accepted")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_batch", 1), ("max_question_chars", 1)))


# The loops ``Policy.rollout`` runs a request's trajectories with; ``loops.WORKERS`` has the rollout worker of each.
LOCKSTEP, ASYNC = "lockstep", "async"


class Schedule(Protocol):
    """Which loop runs a request's trajectories (``loops.RolloutLoopSettings``: the policy's config is one)."""

    @property
    def rollout_loop(self) -> str: ...


class Policy:
    def __init__(
        self,
        engine: ReloadableEngine,
        tokenizer: Tokenizer,
        search: SearchBackend,
        loop: LoopConfig,
        *,
        model_dir: Path,
        default_sampling: Sampling,
        limits: RolloutLimits,
        on_weight_update: InFlight = InFlight.FINISH,
        engine_seed: int = 0,
        schedule: Schedule,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.search = search
        # Wall time with a rollout or generation running, and with a search outstanding, overlaps counted once.
        self._busy = Busy(metrics.ROLLOUT_BUSY.inc)
        self._searching = Busy(metrics.RETRIEVAL_WAIT.inc)
        self._window = Window(RATE_WINDOW_SECONDS)
        self._tokens = 0
        self.loop = AgentLoop(engine, _TimedSearch(search, self._searching), tokenizer, loop)
        self.model_dir = model_dir
        self.default_sampling = default_sampling
        self.limits = limits
        self.on_weight_update = on_weight_update
        self.engine_seed = engine_seed
        self.rollout_loop = schedule.rollout_loop
        self.gate = VersionGate()
        # (version, checkpoint directory) -> the checkpoint's hash: each served checkpoint is read once.
        self._hashes: dict[tuple[int, str], str] = {}
        metrics.WEIGHT_VERSION.set(self.gate.version)

    # -- input ----------------------------------------------------------------------------------
    def sampling(
        self, temperature: float, top_p: float, max_tokens: int, seed: int, stop: Sequence[str]
    ) -> Sampling:
        """A request's sampling settings; zero values take the server's defaults."""
        base = self.default_sampling
        if temperature < 0:
            raise InvalidArgument(f"sampling.temperature must be >= 0, got {temperature}")
        if not 0 <= top_p <= 1:
            raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {top_p}")
        if max_tokens > self.loop.config.max_model_len:
            raise InvalidArgument(
                f"sampling.max_tokens must be at most max_model_len={self.loop.config.max_model_len}, "
                f"got {max_tokens}"
            )
        if any(not s for s in stop):
            raise InvalidArgument("sampling.stop holds an empty string")
        return Sampling(
            temperature=temperature,
            top_p=top_p or base.top_p,
            max_tokens_per_turn=max_tokens or base.max_tokens_per_turn,
            seed=seed or None,
            stop=tuple(stop),
        )

    def _check_batch(self, what: str, count: int) -> None:
        if count == 0:
            raise InvalidArgument(f"{what} is empty")
        if count > self.limits.max_batch:
            raise InvalidArgument(
                f"{what} holds {count} items; the limit is max_batch={self.limits.max_batch}"
            )

    def _check_prompt(self, what: str, ids: Sequence[int]) -> None:
        limit = self.loop.config.max_model_len
        if len(ids) >= limit:
            raise InvalidArgument(f"{what} is {len(ids)} tokens; the model's maximum length is {limit}")

    def prompt_ids(self, tasks: Sequence[Task]) -> list[list[int]]:
        """Checks the tasks and builds their prompts; raises InvalidArgument naming the bad one."""
        self._check_batch("tasks", len(tasks))
        out = []
        for i, task in enumerate(tasks):
            if not task.question.strip():
                raise InvalidArgument(f"tasks[{i}].question is empty")
            if len(task.question) > self.limits.max_question_chars:
                raise InvalidArgument(
                    f"tasks[{i}].question is {len(task.question)} characters; "
                    f"the limit is {self.limits.max_question_chars}"
                )
            ids = self.loop.prompt_ids(task)
            self._check_prompt(f"tasks[{i}] prompt", ids)
            out.append(ids)
        return out

    # -- work -----------------------------------------------------------------------------------
    async def rollout(
        self, tasks: Sequence[Task], sampling: Sampling, on_end: Callable[[Trajectory | None], None] | None = None
    ) -> list[Trajectory]:
        """Runs the tasks to the end with the configured loop. Every trajectory holds the weights it started on
        to its end (the version fence), so each carries the one version that generated it. ``on_end``: called
        with each trajectory of the async loop as it ends (None when it failed): a rollout worker counts the
        trajectories it has running and the length they reach."""
        prompt_ids = self.prompt_ids(tasks)
        start = time.perf_counter()
        self._begin()
        try:
            if self.rollout_loop == ASYNC:
                try:
                    async with asyncio.TaskGroup() as group:
                        running = [
                            group.create_task(self._trajectory(task, sampling, k, ids, on_end))
                            for k, task, ids in zip(sample_indexes([t.id for t in tasks]), tasks, prompt_ids,
                                                    strict=True)
                        ]
                except BaseExceptionGroup as failed:  # the first failure, as lock-step raises it (UNAVAILABLE, say)
                    raise failed.exceptions[0] from None
                trajectories = [r.result() for r in running]
            else:
                metrics.TRAJECTORIES_IN_FLIGHT.inc(len(tasks))
                try:
                    async with self.gate.rollout() as version:
                        trajectories = await self.loop.run(
                            tasks, sampling, version=version, prompt_ids=prompt_ids, should_abort=self._aborting
                        )
                finally:
                    metrics.TRAJECTORIES_IN_FLIGHT.dec(len(tasks))
        finally:
            self._busy.end()
        self._observe(trajectories, time.perf_counter() - start)
        return trajectories

    def _aborting(self) -> bool:
        return self.gate.abort_requested

    async def _trajectory(self, task: Task, sampling: Sampling, position: int, prompt_ids: list[int],
                          on_end: Callable[[Trajectory | None], None] | None) -> Trajectory:
        metrics.TRAJECTORIES_IN_FLIGHT.inc()
        trajectory: Trajectory | None = None
        try:
            async with self.gate.rollout() as version:
                trajectory = await self.loop.run_one(
                    task, sampling, version=version, position=position, prompt_ids=prompt_ids,
                    should_abort=self._aborting,
                )
                return trajectory
        finally:
            metrics.TRAJECTORIES_IN_FLIGHT.dec()
            if on_end is not None:
                on_end(trajectory)

    async def generate(
        self, prompts: Sequence[str], sampling: Sampling, *, chat: bool
    ) -> tuple[list[Generation], int]:
        """Plain generation (no search loop, only the request's own stop strings)."""
        self._check_batch("prompts", len(prompts))
        requests = []
        for i, prompt in enumerate(prompts):
            if not prompt.strip():
                raise InvalidArgument(f"prompts[{i}] is empty")
            ids = chat_prompt_ids(self.tokenizer, prompt) if chat else self.tokenizer.encode(prompt)
            self._check_prompt(f"prompts[{i}]", ids)
            room = self.loop.config.max_model_len - len(ids)
            requests.append(GenerationRequest(ids, min(sampling.max_tokens_per_turn, room), sampling.seed))
        self._begin()
        try:
            async with self.gate.rollout() as version:
                generations = await self.engine.generate(requests, sampling, sampling.stop)
        finally:
            self._busy.end()
        self._observe_generations(generations)
        return generations, version

    async def update_weights(
        self, version: int, checkpoint_path: str, in_flight: InFlight | None = None, *, sha256: str = "",
        same_version: bool = False,
    ) -> float:
        """Loads a checkpoint into the running engine; returns the seconds taken. ``sha256``: the digest the
        checkpoint's weights must have (``checkpoint_sha256``), checked before anything is loaded;
        ``same_version``: see ``VersionGate.update``.

        A refused update raises with the reason, and the old weights keep serving; one whose load into the
        engine failed raises too, and nothing runs until a load succeeds (``VersionGate.failed``).
        """
        start = time.perf_counter()

        async def load() -> None:
            # Operators (and make test-faults) see when a load runs: a process that dies between these two
            # lines restarts at version 0 and loads the newest announced version again.
            log.info("weights v%d: loading %s", version, path)
            await self.engine.reload_weights(path)

        try:
            async with self.gate.holding():  # no rollout starts on the old weights while the new ones are checked
                path = check_checkpoint(self.model_dir, checkpoint_path)
                if sha256:
                    await self._check_digest(path, sha256)
                await self.gate.update(
                    version, checkpoint_path, load, in_flight=in_flight or self.on_weight_update,
                    abort=self.engine.abort_all, same_version=same_version,
                )
        except Exception:
            metrics.WEIGHT_UPDATE_FAILURES.inc()
            raise
        if sha256:  # Info's digest of the served weights, known without reading them again
            self._hashes = {(version, str(Path(checkpoint_path))): sha256}
        seconds = time.perf_counter() - start
        log.info("weights v%d: serving (update %.1f s)", version, seconds)
        metrics.WEIGHT_UPDATE.observe(seconds)
        metrics.WEIGHT_VERSION.set(version)
        return seconds

    async def _check_digest(self, path: Path, expected: str) -> None:
        """Raises FailedPrecondition unless the weights in ``path`` hash to ``expected``; read in a thread
        (seconds per GB) so that serving goes on meanwhile."""
        try:
            got = await asyncio.to_thread(checkpoint_sha256, path)
        except OSError as exc:
            raise FailedPrecondition(f"checkpoint {path}: its weights cannot be read: {exc}") from exc
        if got != expected:
            raise FailedPrecondition(
                f"checkpoint {path}: its weights hash to sha256 {got}, not the {expected} announced: a damaged "
                "or half-copied checkpoint, or another one at the same path"
            )

    async def abort_rollouts(self) -> None:
        """Ends the running rollouts at their next turn, their engine requests aborted (status ABORTED): for a
        replica that leaves and hands their prompts back."""
        self.gate.abort_requested = True
        await self.engine.abort_all()

    # -- what a result depends on ---------------------------------------------------------------
    async def served_checkpoint(self) -> tuple[int, Path, str]:
        """The served version, its checkpoint directory (the starting model for the initial weights) and the
        checkpoint's hash, read in a thread on first asking (seconds per GB) so that serving goes on. Raises
        OSError when the directory cannot be read any more."""
        if self.gate.failed:
            raise OSError(f"the served weights are unknown: {self.gate.failed}")
        version, loaded = self.gate.version, self.gate.checkpoint_path
        path = Path(loaded) if loaded else self.model_dir
        key = (version, str(path))
        if key not in self._hashes:
            self._hashes = {key: await asyncio.to_thread(checkpoint_sha256, path)}
        return version, path, self._hashes[key]

    async def retriever_info(self) -> tuple[Any, str]:
        """The retriever's description (its ``Info``) and "", or None and why there is none."""
        describe = getattr(self.search, "info", None)
        if describe is None:
            return None, f"the search backend {type(self.search).__name__} does not describe its index"
        try:
            return await describe(), ""
        except Exception as exc:  # a retriever that is down must not fail the policy's own answer
            return None, f"{type(exc).__name__}: {exc}"

    # -- metrics --------------------------------------------------------------------------------
    def _begin(self) -> None:
        """A rollout or generation starts: its time counts from here, and the window records where it began."""
        self._busy.begin()
        self._window.growth(self._tokens, self._busy.seconds(), self._searching.seconds())

    def _count_tokens(self, tokens: int) -> None:
        """``tokens`` generated by a call that ended: the window's rates, over the time anything ran in it."""
        metrics.GENERATED_TOKENS.inc(tokens)
        self._tokens += tokens
        grown_tokens, busy, searching = self._window.growth(self._tokens, self._busy.seconds(),
                                                            self._searching.seconds())
        if busy > 0:
            metrics.GENERATION_TOKENS_PER_SECOND.set(grown_tokens / busy)
            metrics.RETRIEVAL_WAIT_SHARE.set(min(1.0, searching / busy))

    def _observe_generations(self, generations: Sequence[Generation]) -> None:
        self._count_tokens(sum(len(g.token_ids) for g in generations))
        for g in generations:
            if g.first_token_seconds is not None:
                metrics.TIME_TO_FIRST_TOKEN.observe(g.first_token_seconds)

    def _observe(self, trajectories: Sequence[Trajectory], seconds: float) -> None:
        metrics.ROLLOUT_LATENCY.observe(seconds)
        self._count_tokens(sum(sum(t.loss_mask) for t in trajectories))
        for t in trajectories:
            metrics.TRAJECTORY_PHASE.labels("generation").observe(t.generation_seconds)
            metrics.TRAJECTORY_PHASE.labels("retrieval").observe(t.retrieval_seconds)
            metrics.TRAJECTORY_PHASE.labels("waiting").observe(t.waiting_seconds)
            metrics.TURNS.observe(t.num_turns)
            metrics.QUERIES.observe(t.num_queries)
            metrics.QUERIES_DROPPED.inc(t.queries_dropped)
            metrics.RETRIEVAL_ROUNDS.observe(t.retrieval_rounds)
            metrics.TRAJECTORIES.labels(t.status.name.lower()).inc()
            if t.first_token_seconds is not None:
                metrics.TIME_TO_FIRST_TOKEN.observe(t.first_token_seconds)
