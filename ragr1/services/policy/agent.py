"""RAG-R1's multi-turn search agent loop, engine-agnostic, in two schedules over the same turn logic.

Lock-step (``run``): each turn, every live trajectory generates in one engine call, stopping at
``</search>`` or ``</answer>``; the queries of all trajectories that searched go to the retriever in one
call. Each on its own (``run_one``): a trajectory generates, searches and generates again without
waiting for any other, so an engine with continuous batching (vLLM's) sees every live request at
once, and the retriever's router micro-batches the searches that meet. Either way the passages come
back as an ``<information>`` block (``ragr1.protocol.information``). Token ids are kept end
to end: the generated ids are appended as the engine returned them, and only the inserted text
(information, feedback) is tokenised, so the trainer sees exactly the tokens the behaviour policy saw
and sampled. Every piece of the response is also kept as a ``Span`` saying who wrote it, which is what
the reward parses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

from ragr1.protocol import grammar
from ragr1.protocol.grammar import Span, SpanKind
from ragr1.protocol.information import InformationFormat, Passage
from ragr1.protocol.prompts import (
    INVALID_ACTION_FEEDBACK,
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    MAX_TURNS,
    QUERY_SEPARATOR,
    Mode,
    Tokenizer,
    chat_prompt_ids,
    question_prompt,
)
from ragr1.services.common.config import InformationSettings, Validated, check_at_least, part_of, setting
from ragr1.services.common.errors import Unavailable
from ragr1.services.policy import progress


class TrajectoryStatus(enum.Enum):
    """How a trajectory ended; the values match ``ragr1.v1.TrajectoryStatus``."""

    RUNNING = 0
    ANSWERED = 1
    NO_ANSWER = 2
    TRUNCATED = 3
    RETRIEVAL_ERROR = 4
    ABORTED = 5


@dataclasses.dataclass
class SamplingSettings(Validated):
    """The sampling a request gets where it leaves a value at zero: the policy's settings, and the
    defaults of every ``Sampling``."""

    temperature: float = setting(1.0, "sampling temperature; 0 is greedy")
    top_p: float = setting(1.0, "nucleus mass")
    # The loop lowers a turn's budget where the context would overflow.
    max_tokens_per_turn: int = setting(256, "new tokens per generation turn")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_tokens_per_turn", 1),))


@dataclasses.dataclass
class Sampling(SamplingSettings):
    """One request's sampling (``SamplingParams`` on the wire, whose ``max_tokens`` is ``max_tokens_per_turn``)."""

    # None: unseeded. Otherwise each trajectory and turn gets its own seed derived from this one,
    # so that samples of the same prompt differ and a run is reproducible.
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: SamplingSettings) -> Sampling:
        """``settings`` as a request's sampling (unseeded, no stop strings of its own)."""
        return part_of(cls, settings, SamplingSettings)


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: Sequence[int]
    max_tokens: int
    seed: int | None


@dataclasses.dataclass
class Generation:
    """What the engine returns for one request: new ids, their log-probabilities, and how it ended.

    ``finish_reason`` "stop" without a ``stop`` string means a stop token ended the generation and is the
    last of ``token_ids``: the tokenizer's end-of-sequence token, any other that the model's generation
    config lists (vLLM stops on every one: Qwen2.5-Instruct lists <|im_end|> and <|endoftext|>), or a
    stop token id."""

    token_ids: list[int]
    logprobs: list[float]
    # The stop string that ended the generation, or None (a stop token, or length).
    stop: str | None = None
    finish_reason: str = "stop"
    # Seconds from submission to the first token, when the engine knows it.
    first_token_seconds: float | None = None
    # Seconds from submission to the last token, when the engine knows it: the request's own time, which in
    # a lock-step turn is shorter than the turn's.
    seconds: float | None = None

    @property
    def ended_on_stop_token(self) -> bool:
        return self.finish_reason == "stop" and self.stop is None and bool(self.token_ids)


class Engine(Protocol):
    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: Sampling, stop: Sequence[str]
    ) -> list[Generation]:
        """One generation per request, in order. ``stop`` strings end a generation and stay in its ids."""
        ...


class SearchBackend(Protocol):
    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        """Passages for every query, in order. ``groups[i]`` names the trajectory of ``queries[i]``."""
        ...


# Tokens the layout adds around each query's documents (JSON keys, quotes, escaped new lines, a query
# of up to ~16 tokens) and around a block (the tags), with room to spare; tests/policy checks them on real
# passages.
QUERY_OVERHEAD_TOKENS = 48
BLOCK_OVERHEAD_TOKENS = 16
# What the context check assumes for the prompt (RAG-R1's instructions and a question: ~250 tokens).
PROMPT_TOKENS = 320
# Prompt plus response: the context length of the model served by default (SmolLM2-135M: 8,192); the loop's
# cut and the engine's size must be the same number.
MAX_MODEL_LEN = 8192


@dataclasses.dataclass
class ContextSettings(Validated):
    """The context length: the engine's size and the loop's cut must be one number."""

    max_model_len: int = setting(MAX_MODEL_LEN, "longest prompt + response, tokens", group="model")


@dataclasses.dataclass
class LoopConfig(ContextSettings, InformationSettings):
    """Settings of the loop (the policy's config is one)."""

    # InformationSettings names its group; the loop's own settings are the policy's own.
    help_group: ClassVar[str] = ""

    mode: str = setting(Mode.MULTI.value, "search mode of tasks that do not say: multi, single, none or search-r1")
    query_separator: str = setting(QUERY_SEPARATOR, "separator of queries inside <search>")
    max_queries_per_search: int = setting(MAX_QUERIES, "query cap per <search> (multi mode)")
    max_turns: int = setting(MAX_TURNS, "generation turns before the final answer turn (RAG-R1: 4)")
    max_query_chars: int = setting(MAX_QUERY_CHARS, "queries are cut to this many characters")
    retrieval_timeout_seconds: float = setting(30.0, "deadline of one search call")

    @property
    def search_mode(self) -> Mode:
        return Mode.parse(self.mode)

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_turns", 0), ("max_queries_per_search", 1), ("max_model_len", 1)))
        Mode.parse(self.mode)

    def search_tokens(self, max_tokens: int) -> int:
        """The most tokens one searching turn can add: its generation and a full information block."""
        return max_tokens + self.max_queries_per_search * (self.tokens_per_query + QUERY_OVERHEAD_TOKENS) + (
            BLOCK_OVERHEAD_TOKENS
        )

    def context_needed(self, max_tokens: int, prompt_tokens: int = PROMPT_TOKENS) -> int:
        """Tokens for ``max_turns`` full searches and the final answer turn after a typical prompt."""
        return prompt_tokens + self.max_turns * self.search_tokens(max_tokens) + max_tokens


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    question: str
    # None: the loop's configured mode.
    mode: Mode | None = None


@dataclasses.dataclass
class Trajectory:
    task: Task
    prompt_ids: list[int]
    policy_version: int
    # The mode the trajectory ran in (the task's, or the loop's default).
    mode: Mode = Mode.MULTI
    # Which sample of its task it is (``sample_indexes``): seeds derive from it, so that a seeded prompt draws
    # the same trajectories whichever schedule, batch or group runs it.
    position: int = 0
    response_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    # The response as text, piece by piece, with who wrote each piece.
    spans: list[Span] = dataclasses.field(default_factory=list)
    status: TrajectoryStatus = TrajectoryStatus.RUNNING
    error: str = ""
    # A RETRIEVAL_ERROR because the retriever was down (it answered UNAVAILABLE): no fault of the prompt's.
    retriever_down: bool = False
    num_turns: int = 0
    retrieval_rounds: int = 0
    num_queries: int = 0
    # Queries written past max_queries_per_search, not searched.
    queries_dropped: int = 0
    invalid_actions: int = 0
    # (search round, passage) for every passage shown to the model.
    retrieved: list[tuple[int, Passage]] = dataclasses.field(default_factory=list)
    generation_seconds: float = 0.0
    retrieval_seconds: float = 0.0
    first_token_seconds: float | None = None
    # From its start to its end; what generation and retrieval do not account for was spent waiting (on the
    # other trajectories of a lock-step turn, for the event loop).
    wall_seconds: float = 0.0
    started: float = dataclasses.field(default_factory=time.perf_counter, repr=False)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def live(self) -> bool:
        return self.status is TrajectoryStatus.RUNNING

    @property
    def waiting_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.generation_seconds - self.retrieval_seconds)

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float], text: str) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.spans.append(Span(text, SpanKind.GENERATED))

    def add_inserted(self, ids: Sequence[int], text: str, kind: SpanKind) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.spans.append(Span(text, kind))

    def end(self, status: TrajectoryStatus, error: str = "") -> None:
        self.status, self.error = status, error
        self.wall_seconds = time.perf_counter() - self.started


def sample_indexes(task_ids: Sequence[str]) -> list[int]:
    """For each entry, how many entries before it have the same task id: sample k of a task (its rollout id is
    "<task id>/k")."""
    seen: dict[str, int] = {}
    out = []
    for task_id in task_ids:
        out.append(seen.get(task_id, 0))
        seen[task_id] = out[-1] + 1
    return out


class AgentLoop:
    """Runs batches of tasks through think / search / information / answer."""

    def __init__(
        self, engine: Engine, search: SearchBackend, tokenizer: Tokenizer, config: LoopConfig
    ) -> None:
        self.engine = engine
        self.search = search
        self.tokenizer = tokenizer
        self.config = config
        self.information = InformationFormat(tokenizer, config.tokens_per_query)
        self._feedback_ids = self._encode(INVALID_ACTION_FEEDBACK)
        # Trajectories waiting on a search call now (their places in the engine's batch are free meanwhile), and
        # who wants to hear when more start waiting (a rollout worker that keeps the engine full).
        self.searching = 0
        self.on_search: Callable[[], None] | None = None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def mode(self, task: Task) -> Mode:
        return self.config.search_mode if task.mode is None else task.mode

    def prompt_ids(self, task: Task) -> list[int]:
        """The task's RAG-R1 prompt in the chat template, as token ids (the only prompt tokenisation)."""
        cfg = self.config
        text = question_prompt(
            task.question, self.mode(task), separator=cfg.query_separator, max_queries=cfg.max_queries_per_search
        )
        return chat_prompt_ids(self.tokenizer, text)

    def _start(self, task: Task, version: int, position: int, prompt_ids: Sequence[int] | None) -> Trajectory:
        ids = self.prompt_ids(task) if prompt_ids is None else prompt_ids
        return Trajectory(task, list(ids), version, self.mode(task), position=position)

    @staticmethod
    def _stop(sampling: Sampling) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*grammar.STOP_STRINGS, *sampling.stop]))

    def _abort(self, t: Trajectory) -> None:
        if t.live:
            t.end(TrajectoryStatus.ABORTED, "aborted by a weight update")

    async def run(
        self,
        tasks: Sequence[Task],
        sampling: Sampling,
        *,
        version: int,
        prompt_ids: Sequence[list[int]] | None = None,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> list[Trajectory]:
        """Runs every task to the end in lock-step turns (``prompt_ids`` if the caller has already built them)."""
        ids: Sequence[Sequence[int] | None] = [None] * len(tasks) if prompt_ids is None else prompt_ids
        positions = sample_indexes([task.id for task in tasks])
        trajectories = [
            self._start(task, version, k, p) for k, task, p in zip(positions, tasks, ids, strict=True)
        ]
        stop = self._stop(sampling)
        for turn in range(self.config.max_turns + 1):
            if should_abort():
                for t in trajectories:
                    self._abort(t)
                break
            live = [t for t in trajectories if t.live and self._has_room(t)]
            if not live:
                break
            searches = await self._generate(live, sampling, stop, turn)
            if searches:
                await self._retrieve(searches)
        return trajectories

    async def run_one(
        self,
        task: Task,
        sampling: Sampling,
        *,
        version: int,
        position: int = 0,
        prompt_ids: Sequence[int] | None = None,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> Trajectory:
        """Runs one task to the end on its own: the same turns as ``run``, waiting for no other trajectory.
        ``position``: which sample of the task it is (``sample_indexes``)."""
        t = self._start(task, version, position, prompt_ids)
        stop = self._stop(sampling)
        for turn in range(self.config.max_turns + 1):
            if should_abort():
                self._abort(t)
                break
            if not (t.live and self._has_room(t)):
                break
            searches = await self._generate([t], sampling, stop, turn)
            if searches:
                await self._retrieve(searches)
        return t

    def _has_room(self, t: Trajectory) -> bool:
        if t.length >= self.config.max_model_len:
            t.end(TrajectoryStatus.TRUNCATED, f"context reached max_model_len={self.config.max_model_len}")
            return False
        return True

    def _final(self, t: Trajectory, turn: int) -> bool:
        """The turn in which the trajectory must answer: the last one, or the only one without search."""
        return turn == self.config.max_turns or t.mode is Mode.NONE

    async def _generate(
        self, live: list[Trajectory], sampling: Sampling, stop: Sequence[str], turn: int
    ) -> list[tuple[Trajectory, grammar.Action]]:
        cfg = self.config
        requests = [
            GenerationRequest(
                t.prompt_ids + t.response_ids,
                min(sampling.max_tokens_per_turn, cfg.max_model_len - t.length),
                None if sampling.seed is None else sampling.seed + 1000 * t.position + turn,
            )
            for t in live
        ]
        start = time.perf_counter()
        generations = await self.engine.generate(requests, sampling, stop)
        progress.advanced()
        elapsed = time.perf_counter() - start
        searches: list[tuple[Trajectory, grammar.Action]] = []
        for t, generation in zip(live, generations, strict=True):
            ids, logprobs = generation.token_ids, generation.logprobs
            if generation.ended_on_stop_token:
                # The feedback may follow; like the references (which decode without special tokens), the
                # stop token goes first, whichever it is, so the model is never trained on text that
                # follows its own end of turn.
                ids, logprobs = ids[:-1], logprobs[:-1]
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            t.add_generated(ids, logprobs, text)
            t.num_turns += 1
            t.generation_seconds += elapsed if generation.seconds is None else generation.seconds
            if t.first_token_seconds is None:
                t.first_token_seconds = generation.first_token_seconds
            if generation.finish_reason == "abort":
                t.end(TrajectoryStatus.ABORTED, "generation aborted by a weight update")
                continue
            action = grammar.parse_action(
                text,
                multi_query=t.mode is Mode.MULTI,
                separator=cfg.query_separator,
                max_queries=cfg.max_queries_per_search,
            )
            if action.kind == "answer":
                t.end(TrajectoryStatus.ANSWERED)
            elif self._final(t, turn):
                t.end(TrajectoryStatus.NO_ANSWER, f"no <answer> after {t.num_turns} turns")
            elif action.kind == "search":
                t.queries_dropped += action.dropped
                searches.append((t, action))
            else:
                t.invalid_actions += 1
                self._insert(t, self._feedback_ids, INVALID_ACTION_FEEDBACK, SpanKind.FEEDBACK)
        return searches

    def _insert(self, t: Trajectory, ids: list[int], text: str, kind: SpanKind) -> None:
        """Appends system text, or ends the trajectory as truncated if it does not fit."""
        if t.length + len(ids) > self.config.max_model_len:
            t.end(TrajectoryStatus.TRUNCATED, f"inserted text would pass max_model_len={self.config.max_model_len}")
            return
        t.add_inserted(ids, text, kind)

    async def _retrieve(self, searches: list[tuple[Trajectory, grammar.Action]]) -> None:
        """One retriever call for the queries of every trajectory that searched this turn."""
        cfg = self.config
        queries = [q[: cfg.max_query_chars] for _, action in searches for q in action.queries]
        groups = [i for i, (_, action) in enumerate(searches) for _ in action.queries]
        start = time.perf_counter()
        self.searching += len(searches)
        if self.on_search is not None:
            self.on_search()
        try:
            try:
                results = await asyncio.wait_for(
                    self.search.search(queries, groups), timeout=cfg.retrieval_timeout_seconds
                )
            finally:
                self.searching -= len(searches)
            if len(results) != len(queries):
                raise ValueError(f"retriever returned {len(results)} results for {len(queries)} queries")
        except Exception as exc:  # any failure of the dependency ends these trajectories, never the batch
            elapsed = time.perf_counter() - start
            reason = (
                f"retriever timed out after {cfg.retrieval_timeout_seconds} s"
                if isinstance(exc, TimeoutError)
                else f"retriever failed: {type(exc).__name__}: {exc}"
            )
            for t, _ in searches:
                t.retrieval_seconds += elapsed
                t.retriever_down = isinstance(exc, Unavailable)
                t.end(TrajectoryStatus.RETRIEVAL_ERROR, reason)
            return
        progress.advanced()
        elapsed = time.perf_counter() - start
        offset = 0
        for t, action in searches:
            mine = results[offset : offset + len(action.queries)]
            offset += len(action.queries)
            t.retrieval_seconds += elapsed
            t.retrieved += [(t.retrieval_rounds, p) for passages in mine for p in passages]
            t.retrieval_rounds += 1
            t.num_queries += len(action.queries)
            if t.mode is Mode.SEARCH_R1:
                block = self.information.search_r1_block(mine)
            else:
                block = self.information.block(
                    [q[: cfg.max_query_chars] for q in action.queries], mine, t.mode is Mode.MULTI
                )
            self._insert(t, self._encode(block), block, SpanKind.INFORMATION)
