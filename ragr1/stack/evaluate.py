"""Evaluation through the running stack: questions go to ``Policy.Rollout`` (which searches through the
retriever and is scored by the reward service), and the rollouts are summed up per benchmark and mode.

Greedy decoding by default: Search-R1's evaluation sampled by accident, which makes EM noisy. Every
mean comes with a 95% bootstrap interval over the questions (``stats``). EM, token F1 and cover-EM (a
normalised gold inside the normalised answer) are reported per data source. In the ``search-r1`` mode
the policy speaks Search-R1's protocol and the answer is taken and scored as Search-R1 does
(``search_r1``), so that its checkpoints score as in its own tables.

Every result is recorded with what makes it comparable (``provenance``): the corpus (content hash and
size), the retriever (encoder, index type, top-k), the served checkpoint's hash, the loop's settings, the
sampling settings and seeds the rollouts carry, and the code's commit; two evaluations are compared only
when their corpus and retriever are the same (``incomparable``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ragr1.services.common.provenance import code_commit
from ragr1.shipped import EVAL_BENCHMARKS, eval_path, question_type, read_jsonl, record_source
from ragr1.stack import search_r1
from ragr1.stack.stats import Estimate, bootstrap
from ragr1.v1 import common_pb2, policy_pb2

# "none" is the no-retrieval baseline: the prompt offers no search and the model answers in one turn.
MODES = {
    "none": common_pb2.SEARCH_MODE_NONE,
    "single": common_pb2.SEARCH_MODE_SINGLE,
    "multi": common_pb2.SEARCH_MODE_MULTI,
    "search-r1": common_pb2.SEARCH_MODE_SEARCH_R1,
}
# ``all``: this project's modes; Search-R1's is asked for by name.
OWN_MODES = ("none", "single", "multi")

MODE_NAMES = {value: name for name, value in MODES.items()}


def parse_modes(text: str) -> list[str]:
    """``--mode``: one mode, a comma-separated list, ``both`` (single and multi) or ``all`` (none, single,
    multi)."""
    if text == "both":
        return ["single", "multi"]
    if text == "all":
        return list(OWN_MODES)
    modes = [m for m in text.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"--mode {text!r}: use {', '.join(MODES)}, a comma-separated list of them, both or all")
    return modes


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    question: str
    golden_answers: list[str]
    data_source: str
    supporting_titles: list[str] = dataclasses.field(default_factory=list)
    # "single-hop", "bridge" or "comparison" ("" unknown): ``shipped.question_type``.
    question_type: str = ""


def load_questions(source: str | Path, limit: int | None = None) -> list[Question]:
    """A benchmark name (``nq``, ``hotpotqa`` …), a JSONL file of the same layout, or a Search-R1 / RAG-R1
    parquet file (its ``test.parquet``: any mix of data sources, each kept).

    A record without ``question`` or ``golden_answers`` raises ValueError naming the file and line (row).
    """
    path = eval_path(str(source)) if str(source) in EVAL_BENCHMARKS else Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (benchmarks: {', '.join(EVAL_BENCHMARKS)})")
    if path.name.endswith(".parquet"):
        from ragr1.services.trainer.data import read_parquet

        return [Question(t.id, t.question, list(t.golden_answers), t.data_source, question_type=t.question_type)
                for t in read_parquet(path, "single", limit)]
    name = path.name.split(".")[0]
    out: list[Question] = []
    for lineno, record in enumerate(read_jsonl(path, limit=limit), start=1):
        question, answers = record.get("question"), record.get("golden_answers")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{path}:{lineno}: field 'question' is missing or empty")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"{path}:{lineno}: field 'golden_answers' must be a non-empty list of strings")
        source = record_source(record, path)
        out.append(Question(
            id=str(record.get("id", f"{name}-{lineno}")),
            question=question,
            golden_answers=answers,
            data_source=source,
            supporting_titles=list(record.get("supporting_titles") or []),
            question_type=question_type(record, source),
        ))
    return out


def to_task(q: Question, mode: str, run: str = "eval") -> common_pb2.PromptTask:
    return common_pb2.PromptTask(
        id=f"{run}:{mode}:{q.id}", question=q.question, golden_answers=q.golden_answers,
        supporting_titles=q.supporting_titles, data_source=q.data_source, mode=MODES[mode],
        question_type=q.question_type,
    )


@dataclasses.dataclass
class EvalSummary:
    benchmark: str
    mode: str
    questions: int
    exact_match: float
    f1: float
    format_valid: float
    answered: float
    retrieval_rounds: float
    queries: float
    seconds_per_question: float
    errors: int
    # 95% bootstrap intervals over the questions, (low, high).
    exact_match_ci: tuple[float, float] = (0.0, 0.0)
    f1_ci: tuple[float, float] = (0.0, 0.0)
    # A normalised gold inside the normalised answer (Search-R1's subem_check).
    cover_em: float = 0.0
    cover_em_ci: tuple[float, float] = (0.0, 0.0)

    def row(self) -> list[str]:
        def cell(value: float, ci: tuple[float, float]) -> str:
            return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"

        return [self.benchmark, self.mode, str(self.questions), cell(self.exact_match, self.exact_match_ci),
                cell(self.f1, self.f1_ci), cell(self.cover_em, self.cover_em_ci),
                f"{self.format_valid:.2f}", f"{self.retrieval_rounds:.2f}", f"{self.queries:.2f}",
                f"{self.seconds_per_question:.2f}"]


HEADER = ["benchmark", "mode", "n", "EM [95% CI]", "F1 [95% CI]", "cover-EM [95% CI]", "format ok", "rounds",
          "queries", "s/question"]


def answer_scores(r: common_pb2.Rollout, mode: str) -> tuple[str, float, float, float]:
    """The answer a rollout is scored on, its EM, F1 and cover-EM: Search-R1's extraction and scoring in its
    mode; the reward service's answer, EM and F1 otherwise."""
    if mode == "search-r1":
        answer, em, f1, cover = search_r1.score(r.question, r.response_text, r.golden_answers)
        return answer or "", em, f1, cover
    answer = r.reward.extracted_answer
    cover = search_r1.cover_match(answer, r.golden_answers) if answer else 0.0
    return answer, r.reward.exact_match, r.reward.f1, cover


def _interval(estimate: Estimate) -> tuple[float, float]:
    return (estimate.low, estimate.high)


def summarise(benchmark: str, mode: str, rollouts: Sequence[common_pb2.Rollout], wall_seconds: float) -> EvalSummary:
    n = len(rollouts)

    def mean(values: Iterable[float]) -> float:
        values = list(values)
        return statistics.fmean(values) if values else 0.0

    scores = [answer_scores(r, mode)[1:] for r in rollouts]
    em, f1, cover = (bootstrap([s[i] for s in scores]) for i in range(3))
    return EvalSummary(
        benchmark=benchmark,
        mode=mode,
        questions=n,
        exact_match=mean(s[0] for s in scores),
        f1=mean(s[1] for s in scores),
        exact_match_ci=_interval(em),
        f1_ci=_interval(f1),
        cover_em=mean(s[2] for s in scores),
        cover_em_ci=_interval(cover),
        # Every check of the format reward passed (the reward service's "valid sequence").
        format_valid=mean(1.0 if r.reward.format >= 1.0 else 0.0 for r in rollouts),
        answered=mean(1.0 if r.status == common_pb2.TRAJECTORY_STATUS_ANSWERED else 0.0 for r in rollouts),
        retrieval_rounds=mean(r.retrieval_rounds for r in rollouts),
        queries=mean(r.num_queries for r in rollouts),
        seconds_per_question=wall_seconds / n if n else 0.0,
        errors=sum(1 for r in rollouts if r.status == common_pb2.TRAJECTORY_STATUS_RETRIEVAL_ERROR),
    )


RolloutFn = Callable[[Sequence[common_pb2.PromptTask]], list[common_pb2.Rollout]]


def run_questions(
    rollout: RolloutFn, questions: Sequence[Question], modes: Sequence[str], batch_size: int = 16, run: str = "eval",
    progress: Callable[[int], object] | None = None,
) -> dict[str, tuple[list[common_pb2.Rollout], float]]:
    """Runs every question once in each of ``modes``; returns each mode's rollouts (in question order) and its
    share of the wall seconds. The modes' questions go out in one sequence of batches of ``batch_size``: a batch
    takes about as long as its longest trajectory, so a mode's last, short batch would cost nearly a full one's.
    A batch's seconds are shared out by question, as ``summarise_sources`` does."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {', '.join(map(repr, unknown))}")
    modes = list(dict.fromkeys(modes))
    # Rollouts come back matched by task id, which is the question's id in its mode.
    repeated = [i for i, n in collections.Counter(q.id for q in questions).items() if n > 1]
    if repeated:
        raise ValueError(f"question ids must be unique within a run: {repeated[:3]} appear more than once")
    tasks = [(mode, to_task(q, mode, run)) for mode in modes for q in questions]
    got: dict[str, common_pb2.Rollout] = {}
    seconds = dict.fromkeys(modes, 0.0)
    for i in range(0, len(tasks), batch_size):
        batch = tasks[i:i + batch_size]
        start = time.perf_counter()
        replies = rollout([task for _, task in batch])
        elapsed = time.perf_counter() - start
        got.update((r.task_id, r) for r in replies)
        for mode, n in collections.Counter(mode for mode, _ in batch).items():
            seconds[mode] += elapsed * n / len(batch)
        if progress is not None:
            progress(len(batch))
    missing = [task.id for _, task in tasks if task.id not in got]
    if missing:
        raise ValueError(f"the policy returned no rollout for {len(missing)} of {len(tasks)} tasks: {missing[:3]}")
    return {
        mode: ([got[task.id] for m, task in tasks if m == mode], seconds[mode]) for mode in modes
    }


def summarise_sources(
    mode: str,
    rollouts: Sequence[common_pb2.Rollout],
    wall_seconds: float,
    search_r1_names: bool | None = None,
    benchmark: str | None = None,
) -> list[EvalSummary]:
    """One summary per ``data_source`` (each source reported on its own), in order of appearance; the wall
    time is shared out by question. The sources take Search-R1's names in its mode, and in every mode where
    ``search_r1_names`` (a run that sets another mode beside it: its rows name the same benchmarks). Otherwise
    a set of one source is reported under its ``benchmark`` name where one is given: the name the user asked
    for, where the file may spell its source otherwise (FlashRAG's Bamboogle file says "Bamboogle")."""
    renamed = mode == "search-r1" if search_r1_names is None else search_r1_names
    name = search_r1.source_name if renamed else str
    sources = list(dict.fromkeys(name(r.data_source) for r in rollouts))
    if benchmark is not None and not renamed and len(sources) == 1:
        return [summarise(benchmark, mode, list(rollouts), wall_seconds)]
    per_question = wall_seconds / len(rollouts) if rollouts else 0.0
    out = []
    for source in sources:
        mine = [r for r in rollouts if name(r.data_source) == source]
        out.append(summarise(source, mode, mine, per_question * len(mine)))
    return out


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = HEADER) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]])


def rollout_record(r: common_pb2.Rollout) -> dict[str, Any]:
    """What the JSON report keeps of one rollout: the answer and scores its mode's scoring gives, and the
    trajectory's own seconds (generating and waiting on retrieval; a batch's wall time is shared by its
    trajectories, so these add up to more than it)."""
    mode = MODE_NAMES.get(r.mode, "default")
    answer, em, f1, cover = answer_scores(r, mode)
    return {
        "task_id": r.task_id, "question": r.question, "golden_answers": list(r.golden_answers),
        "data_source": r.data_source, "question_type": r.question_type, "mode": mode,
        "answer": answer, "exact_match": em, "f1": f1, "cover_em": cover,
        "format": r.reward.format, "retrieval_rounds": r.retrieval_rounds, "queries": r.num_queries,
        "seconds": r.generation_seconds + r.retrieval_seconds,
        "status": common_pb2.TrajectoryStatus.Name(r.status), "policy_version": r.policy_version,
        "response": r.response_text,
        # What the model wrote (the system's passages and feedback left out), as the reward read it.
        "generated": "".join(s.text for s in r.spans if s.kind == common_pb2.SPAN_KIND_GENERATED),
    }


def _sampling(params: common_pb2.SamplingParams) -> dict[str, Any]:
    return {"temperature": round(params.temperature, 6), "top_p": round(params.top_p, 6),
            "max_tokens": params.max_tokens, "seed": params.seed, "stop": list(params.stop)}


def provenance(info: policy_pb2.PolicyInfoResponse, rollouts: Sequence[common_pb2.Rollout] = ()) -> dict[str, Any]:
    """What an evaluation's numbers depend on, from the policy's ``Info`` and the rollouts themselves (the
    sampling settings they were generated with: every distinct one, in order of appearance)."""
    r = info.retriever
    sampling = list({json.dumps(_sampling(x.sampling), sort_keys=True): _sampling(x.sampling)
                     for x in rollouts}.values())
    return {
        "corpus": {"sha256": r.corpus_sha256, "passages": r.num_passages},
        "retriever": {"encoder": r.encoder, "index_type": r.index_type, "top_k": info.top_k,
                      "shards": r.num_shards, "manifest_sha256": r.manifest_sha256,
                      **({"error": info.retriever_error} if info.retriever_error else {})},
        "checkpoint": {"path": info.checkpoint_path, "sha256": info.checkpoint_sha256,
                       "weight_version": info.weight_version,
                       **({"error": info.checkpoint_error} if info.checkpoint_error else {})},
        "loop": {"default_mode": MODE_NAMES.get(info.mode, "default"), "max_turns": info.max_turns,
                 "max_queries_per_search": info.max_queries_per_search,
                 "query_separator": info.query_separator, "tokens_per_query": info.tokens_per_query,
                 "max_model_len": info.max_model_len},
        "sampling": sampling,
        "default_sampling": _sampling(info.default_sampling),
        "seed": {"engine": info.engine_seed, "requests": sorted({x.sampling.seed for x in rollouts})},
        "code_commit": {"policy": info.code_commit, "evaluation": code_commit()},
    }


# What two evaluations must share for their numbers to be paired: the passages searched, and how.
COMPARABLE = (("corpus", ("sha256", "passages")), ("retriever", ("encoder", "index_type", "top_k")))


def incomparable(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Why evaluations with provenances ``a`` and ``b`` must not be compared ("" when they may be): a corpus
    or retriever setting that differs, or one that is unknown (a retriever that did not describe itself)."""
    for part, keys in COMPARABLE:
        for key in keys:
            x, y = a.get(part, {}).get(key), b.get(part, {}).get(key)
            if x in (None, "", 0) or y in (None, "", 0):
                return f"{part} {key} unknown"
            if x != y:
                return f"{part} {key} differs: {x!r} against {y!r}"
    return ""


def provenance_line(p: dict[str, Any]) -> str:
    """One line for a terminal: corpus, retriever, checkpoint and commit."""
    c, r, k = p["corpus"], p["retriever"], p["checkpoint"]
    return (f"corpus sha256 {c['sha256'][:12] or '?'} ({c['passages']} passages); retriever {r['encoder'] or '?'} "
            f"{r['index_type'] or '?'} top-{r['top_k']}; checkpoint v{k['weight_version']} sha256 "
            f"{k['sha256'][:12] or '?'}; code {p['code_commit']['policy'][:12]}")
