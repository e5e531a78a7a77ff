"""The agent loop against a scripted engine and a scripted retriever, with the real SmolLM2 tokenizer."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, GenerationConfig

from ragr1.protocol.grammar import SpanKind, parse_spans
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK, Mode
from ragr1.services.policy.agent import AgentLoop, Generation, LoopConfig, Sampling, Task, Trajectory, TrajectoryStatus
from tests.policy.scripted import ScriptedEngine, ScriptedSearch

TWO_HOP = [
    "<think>Two facts needed.</think>\n<search> Hamlet author, Shakespeare birthplace </search> ignored",
    "<think>Found it.</think>\n<answer> Stratford-upon-Avon </answer>",
]
ONE_AT_A_TIME = [
    "<think>First.</think><search> Hamlet author </search>",
    "<think>Second.</think><search> Shakespeare birthplace </search>",
    "<answer> Stratford </answer>",
]


def run(
    tokenizer: Any,
    script: dict[str, list[str]],
    search: ScriptedSearch | None = None,
    *,
    tasks: list[Task] | None = None,
    **config: Any,
) -> tuple[list[Trajectory], ScriptedEngine, ScriptedSearch]:
    engine = ScriptedEngine(tokenizer, script)
    search = search or ScriptedSearch()
    loop = AgentLoop(engine, search, tokenizer, LoopConfig(**config))
    tasks = tasks or [Task(f"t{i}", q) for i, q in enumerate(script)]
    out = asyncio.run(loop.run(tasks, Sampling(max_tokens_per_turn=64), version=7))
    return out, engine, search


def generated_ids(engine: ScriptedEngine, question: str) -> list[int]:
    return [i for g in engine.generated[question] for i in g.token_ids]


def test_all_live_trajectories_share_one_retriever_call_per_turn(tokenizer: Any) -> None:
    out, engine, search = run(tokenizer, {"q two hop": TWO_HOP, "q one at a time": ONE_AT_A_TIME})
    assert [t.status for t in out] == [TrajectoryStatus.ANSWERED, TrajectoryStatus.ANSWERED]
    assert search.calls == [
        (["Hamlet author", "Shakespeare birthplace", "Hamlet author"], [0, 0, 1]),
        (["Shakespeare birthplace"], [0]),
    ]
    assert engine.batch_sizes == [2, 2, 1]
    two, one = out
    assert (two.num_turns, two.retrieval_rounds, two.num_queries) == (2, 1, 2)
    assert (one.num_turns, one.retrieval_rounds, one.num_queries) == (3, 2, 2)
    assert {t.policy_version for t in out} == {7}
    assert [r for r, _ in one.retrieved] == [0, 0, 1, 1]


def test_loss_mask_covers_exactly_the_generated_tokens(tokenizer: Any) -> None:
    out, engine, _ = run(tokenizer, {"q two hop": TWO_HOP, "q one at a time": ONE_AT_A_TIME})
    for t in out:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
        masked_in = [i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m == 1]
        assert masked_in == generated_ids(engine, t.task.question)
        assert [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 1] == [
            lp for g in engine.generated[t.task.question] for lp in g.logprobs
        ]
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
        inserted = tokenizer.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m == 0])
        assert inserted.count("<information>") == t.retrieval_rounds
        assert 'Doc 1: \\"Page Hamlet author 0\\"\\nFacts about Hamlet author, part 0.' in inserted
    # The ids are the prompt followed by the generated and inserted ids, never re-tokenised text.
    two = out[0]
    first_turn = engine.generated["q two hop"][0]
    assert two.response_ids[: len(first_turn.token_ids)] == first_turn.token_ids
    assert tokenizer.decode(first_turn.token_ids).endswith("</search>")


def test_query_cap_limits_what_the_retriever_sees(tokenizer: Any) -> None:
    script = {"q many": ["<search> a, b, c, d, e </search>", "<answer> x </answer>"]}
    out, _, search = run(tokenizer, script, max_queries_per_search=2)
    assert search.calls[0][0] == ["a", "b"]
    assert out[0].num_queries == 2
    assert out[0].queries_dropped == 3  # counted (ragr1_policy_queries_dropped_total), since RAG-R1 runs them all


def test_single_query_mode_sends_the_whole_query(tokenizer: Any) -> None:
    script = {"q single": ["<search> a, b </search>", "<answer> x </answer>"]}
    out, _, search = run(tokenizer, script, mode="single")
    assert search.calls[0][0] == ["a, b"]
    prompt = tokenizer.decode(out[0].prompt_ids)
    assert "<search> query </search>" in prompt and "<|im_start|>assistant\n" in prompt


def test_invalid_action_gets_rag_r1s_feedback_and_another_turn(tokenizer: Any) -> None:
    script = {"q lost": ["I am not sure what to do.", "<answer> Paris </answer>"]}
    out, _, search = run(tokenizer, script)
    t = out[0]
    assert t.status is TrajectoryStatus.ANSWERED and t.invalid_actions == 1 and t.num_turns == 2
    assert search.calls == []
    inserted = tokenizer.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m == 0])
    assert inserted.startswith("\nMy previous action is invalid.")


def test_max_turns_then_a_final_turn_without_search(tokenizer: Any) -> None:
    script = {"q forever": ["<search> more </search>"]}
    out, _, search = run(tokenizer, script, max_turns=2)
    t = out[0]
    assert t.status is TrajectoryStatus.NO_ANSWER
    assert (t.num_turns, t.retrieval_rounds) == (3, 2)
    assert len(search.calls) == 2


def test_retriever_failure_ends_searching_trajectories_only(tokenizer: Any) -> None:
    script = {"q search": ONE_AT_A_TIME, "q direct": ["<answer> now </answer>"]}
    out, _, search = run(tokenizer, script, ScriptedSearch(fail=ConnectionError("shard 3 down")))
    searching, direct = out
    assert searching.status is TrajectoryStatus.RETRIEVAL_ERROR
    assert "shard 3 down" in searching.error
    assert direct.status is TrajectoryStatus.ANSWERED
    assert len(search.calls) == 1
    assert len(searching.response_ids) == len(searching.loss_mask) == len(searching.logprobs)


def test_retriever_timeout_never_hangs(tokenizer: Any) -> None:
    slow = ScriptedSearch(hang=True)
    out, _, _ = run(tokenizer, {"q slow": ONE_AT_A_TIME}, slow, retrieval_timeout_seconds=0.2)
    assert out[0].status is TrajectoryStatus.RETRIEVAL_ERROR
    assert "timed out" in out[0].error


def test_information_is_cut_per_query_in_single_mode_too(tokenizer: Any) -> None:
    script = {"q big": ["<search> Hamlet author </search>", "<answer> x </answer>"]}
    out, _, _ = run(tokenizer, script, ScriptedSearch(top_k=20), tokens_per_query=30, mode="single")
    t = out[0]
    inserted = sum(1 for m in t.loss_mask if m == 0)
    wrappers = len(tokenizer.encode("\n<information>\n", add_special_tokens=False)) + len(
        tokenizer.encode("\n</information>\n", add_special_tokens=False)
    )
    assert inserted == 30 + wrappers


def test_context_limit_truncates(tokenizer: Any) -> None:
    loop = AgentLoop(ScriptedEngine(tokenizer, {}), ScriptedSearch(), tokenizer, LoopConfig())
    engine_prompt_len = len(loop.prompt_ids(Task("x", "q long")))
    out, _, _ = run(tokenizer, {"q long": ["<search> a </search>"]}, max_model_len=engine_prompt_len + 20)
    t = out[0]
    assert t.status is TrajectoryStatus.TRUNCATED
    assert t.length <= engine_prompt_len + 20


def test_abort_ends_live_trajectories(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, {"q a": ONE_AT_A_TIME})
    loop = AgentLoop(engine, ScriptedSearch(), tokenizer, LoopConfig())
    calls = iter([False, True])
    out = asyncio.run(loop.run([Task("a", "q a")], Sampling(), version=1, should_abort=lambda: next(calls)))
    assert out[0].status is TrajectoryStatus.ABORTED and out[0].num_turns == 1


def test_per_task_mode_overrides_the_default(tokenizer: Any) -> None:
    tasks = [Task("s", "q s", Mode.SINGLE), Task("m", "q m", Mode.MULTI)]
    script = {
        "q s": ["<search> a, b </search>", "<answer> x </answer>"],
        "q m": ["<search> a, b </search>", "<answer> x </answer>"],
    }
    _, _, search = run(tokenizer, script, tasks=tasks)
    assert search.calls[0] == (["a, b", "a", "b"], [0, 1, 1])


@pytest.mark.parametrize("seed", [None, 5])
def test_seeds_differ_per_trajectory(tokenizer: Any, seed: int | None) -> None:
    seen: list[Any] = []

    class Recorder(ScriptedEngine):
        async def generate(self, requests, sampling, stop):
            seen.extend(r.seed for r in requests)
            return await super().generate(requests, sampling, stop)

    script = {"q 1": ["<answer> a </answer>"], "q 2": ["<answer> b </answer>"]}
    loop = AgentLoop(Recorder(tokenizer, script), ScriptedSearch(), tokenizer, LoopConfig())
    tasks = [Task("1", "q 1"), Task("2", "q 2")]
    asyncio.run(loop.run(tasks, dataclasses.replace(Sampling(), seed=seed), version=0))
    # Sample 0 of each task: different prompts may share seeds, samples of one prompt do not.
    assert seen == ([None, None] if seed is None else [5, 5])
    seen.clear()
    asyncio.run(loop.run([tasks[0], tasks[0]], dataclasses.replace(Sampling(), seed=seed), version=0))
    assert seen == ([None, None] if seed is None else [5, 1005])


def test_spans_say_who_wrote_every_piece(tokenizer: Any) -> None:
    script = {"q mixed": ["I am not sure.", *TWO_HOP]}
    (t,), _, _ = run(tokenizer, script)
    assert [s.kind for s in t.spans] == [
        SpanKind.GENERATED, SpanKind.FEEDBACK, SpanKind.GENERATED, SpanKind.INFORMATION, SpanKind.GENERATED
    ]
    assert t.spans[1].text == INVALID_ACTION_FEEDBACK
    assert "".join(s.text for s in t.spans) == tokenizer.decode(t.response_ids, skip_special_tokens=False)
    parsed = parse_spans(t.spans)
    assert parsed.answer == "Stratford-upon-Avon" and parsed.invalid_actions == 1


@pytest.fixture(scope="module")
def two_eos_model(policy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's tokenizer with a generation config that lists two end-of-sequence ids, as Qwen2.5-Instruct's
    does (<|im_end|> and <|endoftext|>); vLLM stops on every one of them."""
    directory = tmp_path_factory.mktemp("two-eos")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (policy_model_dir / name).exists():
            shutil.copy(policy_model_dir / name, directory / name)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_model_dir))
    eos = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    assert len(set(eos)) == 2
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return directory


class EndsOnStopToken(ScriptedEngine):
    """A first turn that ends on a stop token without an action, as vLLM returns it: the token last in the ids,
    finish reason "stop", no stop string."""

    def __init__(self, tokenizer: Any, script: dict[str, list[str]], token: int) -> None:
        super().__init__(tokenizer, script)
        self.token = token

    async def generate(self, requests, sampling, stop):  # type: ignore[no-untyped-def]
        out = await super().generate(requests, sampling, stop)
        if self.turns["q eos"] == 1:
            g = out[0]
            out[0] = Generation([*g.token_ids, self.token], [*g.logprobs, -0.5], None, "stop")
        return out


@pytest.mark.parametrize("which", [0, 1])
def test_every_end_of_sequence_id_of_the_generation_config_is_dropped_before_the_feedback(
    two_eos_model: Path, which: int
) -> None:
    """Whichever end-of-sequence token the model stopped on (the tokenizer's, or another that its generation
    config lists and vLLM stops on), it leaves the trajectory with its log-prob, so that PPO never trains on
    the feedback appended after the model's own end of turn."""
    tokenizer = AutoTokenizer.from_pretrained(str(two_eos_model))
    token = GenerationConfig.from_pretrained(str(two_eos_model)).eos_token_id[which]
    script = {"q eos": ["I am not sure.", "<answer> x </answer>"]}
    loop = AgentLoop(EndsOnStopToken(tokenizer, script, token), ScriptedSearch(), tokenizer, LoopConfig())
    (t,) = asyncio.run(loop.run([Task("e", "q eos")], Sampling(max_tokens_per_turn=64), version=0))
    assert t.status is TrajectoryStatus.ANSWERED and t.invalid_actions == 1
    assert token not in t.response_ids  # nothing is trained after the model's own end of turn
    first = tokenizer.encode("I am not sure.", add_special_tokens=False)
    feedback = tokenizer.encode(INVALID_ACTION_FEEDBACK, add_special_tokens=False)
    assert t.response_ids[: len(first) + len(feedback)] == first + feedback
    assert t.loss_mask[: len(first) + len(feedback)] == [1] * len(first) + [0] * len(feedback)
    assert -0.5 not in t.logprobs
    assert t.spans[0].text == "I am not sure."


def test_no_retrieval_mode_answers_in_one_turn_and_never_searches(tokenizer: Any) -> None:
    script = {"q none": ["<think>I know.</think><search> tempting </search>"], "q ok": ["<answer> y </answer>"]}
    tasks = [Task("n", "q none", Mode.NONE), Task("o", "q ok", Mode.NONE)]
    out, _, search = run(tokenizer, script, tasks=tasks)
    assert [t.status for t in out] == [TrajectoryStatus.NO_ANSWER, TrajectoryStatus.ANSWERED]
    assert search.calls == [] and [t.num_turns for t in out] == [1, 1]
    assert "<search>" not in tokenizer.decode(out[0].prompt_ids)


def run_each(loop: AgentLoop, tasks: list[Task], sampling: Sampling, version: int = 7,
             positions: list[int] | None = None) -> list[Trajectory]:
    """The tasks as the async loop runs them: every trajectory its own coroutine, all at once."""
    places = positions or [0] * len(tasks)

    async def go() -> list[Trajectory]:
        return list(await asyncio.gather(
            *(loop.run_one(task, sampling, version=version, position=k) for k, task in zip(places, tasks, strict=True))
        ))

    return asyncio.run(go())


def test_each_trajectory_on_its_own_gives_the_lock_step_trajectories(tokenizer: Any) -> None:
    """The same turn logic in both schedules: with a deterministic engine, the same ids, masks, log-probs,
    spans and counts; each trajectory's searches are its own calls and its generations its own requests."""
    script = {"q two hop": TWO_HOP, "q one at a time": ONE_AT_A_TIME, "q mixed": ["I am not sure.", *TWO_HOP],
              "q forever": ["<search> more </search>"]}
    tasks = [Task(f"t{i}", q) for i, q in enumerate(script)]
    sampling = Sampling(max_tokens_per_turn=64)
    lockstep, _, lockstep_search = run(tokenizer, script, tasks=tasks, max_turns=2)
    engine, search = ScriptedEngine(tokenizer, script), ScriptedSearch()
    each = run_each(AgentLoop(engine, search, tokenizer, LoopConfig(max_turns=2)), tasks, sampling)
    fields = ("status", "response_ids", "loss_mask", "logprobs", "spans", "num_turns", "retrieval_rounds",
              "num_queries", "invalid_actions", "retrieved", "policy_version", "position")
    for a, b in zip(lockstep, each, strict=True):
        assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
        assert b.wall_seconds >= b.generation_seconds + b.retrieval_seconds - 1e-6
    assert set(engine.batch_sizes) == {1}
    assert all(set(groups) == {0} for _, groups in search.calls)
    assert sorted(q for queries, _ in search.calls for q in queries) == sorted(
        q for queries, _ in lockstep_search.calls for q in queries
    )
    assert len(search.calls) == sum(t.retrieval_rounds for t in each) > len(lockstep_search.calls)


@pytest.mark.parametrize("seed", [None, 5])
def test_seeds_follow_the_trajectory_not_the_schedule(tokenizer: Any, seed: int | None) -> None:
    """A trajectory's seeds derive from its place in the request and the turn: the same whether the others
    have ended (lock-step) or run on their own."""
    seen: dict[str, list[Any]] = {}

    class Recorder(ScriptedEngine):
        async def generate(self, requests, sampling, stop):  # type: ignore[no-untyped-def]
            out = await super().generate(requests, sampling, stop)
            for r in requests:
                question = _question(self.tokenizer, r.prompt_ids)
                seen.setdefault(question, []).append(r.seed)
            return out

    script = {"q 1": ["<answer> a </answer>"], "q 2": ONE_AT_A_TIME}
    tasks = [Task("1", "q 1"), Task("2", "q 2")]
    sampling = dataclasses.replace(Sampling(), seed=seed)
    asyncio.run(AgentLoop(Recorder(tokenizer, script), ScriptedSearch(), tokenizer, LoopConfig()).run(
        tasks, sampling, version=0))
    lockstep, seen = seen, {}
    run_each(AgentLoop(Recorder(tokenizer, script), ScriptedSearch(), tokenizer, LoopConfig()), tasks, sampling)
    assert seen == lockstep
    assert lockstep["q 2"] == ([None] * 3 if seed is None else [5, 6, 7])


def _question(tokenizer: Any, ids: Any) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return text.split("Question: ")[1].split("\n")[0]


def test_an_abort_ends_a_trajectory_on_its_own_at_its_next_turn(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, {"q a": ONE_AT_A_TIME})
    loop = AgentLoop(engine, ScriptedSearch(), tokenizer, LoopConfig())
    calls = iter([False, True])
    t = asyncio.run(loop.run_one(Task("a", "q a"), Sampling(), version=1, should_abort=lambda: next(calls)))
    assert t.status is TrajectoryStatus.ABORTED and t.num_turns == 1 and t.retrieval_rounds == 1
