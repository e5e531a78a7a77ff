"""Training data: RL prompts from QA files or Search-R1 parquet, and SFT trajectories (searched: ``sft_search``).

Every reader checks its records before any training starts: a missing or malformed field raises
``ValueError`` naming the file, the line (JSONL) or row (parquet), and the field.

Sequences are token ids end to end: an SFT trajectory is tokenised piece by piece (generated text,
inserted ``<information>`` block, generated text, …) and concatenated, so the loss mask marks exactly
the inserted tokens and nothing is ever re-tokenised across a boundary.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ragr1.protocol.prompts import Mode, Tokenizer, chat_prompt_ids, question_from_prompt, question_prompt
from ragr1.protocol.trajectories import Piece, SupportedQuestion
from ragr1.shipped import question_type, read_jsonl_numbered, record_source
from ragr1.v1 import common_pb2

ABILITY = "fact-reasoning"


@dataclasses.dataclass
class TokenSequence:
    """A prompt and its response as token ids, with the response's loss mask (1 = generated)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.loss_mask):
            raise ValueError(
                f"{len(self.response_ids)} response tokens but {len(self.loss_mask)} mask entries"
            )


_SEARCH_MODES = {
    Mode.SINGLE: common_pb2.SEARCH_MODE_SINGLE,
    Mode.MULTI: common_pb2.SEARCH_MODE_MULTI,
    Mode.NONE: common_pb2.SEARCH_MODE_NONE,
    Mode.SEARCH_R1: common_pb2.SEARCH_MODE_SEARCH_R1,
}


def parse_mode(mode: str | int) -> int:
    """``"single"``/``"multi"``/``"none"`` (or the enum value) -> ``SearchMode``."""
    if isinstance(mode, int):
        return mode
    return _SEARCH_MODES[Mode.parse(mode)]


def mode_of(search_mode: int) -> Mode:
    """``SearchMode`` -> the protocol's ``Mode`` (unspecified means multi, the default)."""
    for mode, value in _SEARCH_MODES.items():
        if value == search_mode:
            return mode
    return Mode.MULTI


def _require(record: dict[str, Any], field: str, where: str) -> Any:
    value: Any = record
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise ValueError(f"{where}: missing field {field!r}")
        value = value[part]
    return value


def _answers(value: Any, where: str, field: str) -> list[str]:
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a.strip() for a in value):
        raise ValueError(
            f"{where}: field {field!r} must be a non-empty list of non-empty strings, got {value!r}"
        )
    return list(value)


def task_id(data_source: str, question: str) -> str:
    """A stable id, so that re-reading a file produces the same tasks (and the queue de-duplicates)."""
    return f"{data_source}-{hashlib.sha1(question.encode()).hexdigest()[:12]}"


def load_qa_tasks(path: Path, mode: str | int, limit: int | None = None) -> list[common_pb2.PromptTask]:
    """``PromptTask``s from a QA JSONL file (``question``, ``golden_answers``; optional
    ``supporting_titles``, ``dataset``/``data_source``, ``question_type``/``type``: ``shipped.question_type``)."""
    search_mode = parse_mode(mode)
    tasks = []
    for lineno, record in read_jsonl_numbered(path, limit):
        where = f"{path}:{lineno}"
        question = _require(record, "question", where)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: field 'question' must be a non-empty string")
        answers = _answers(_require(record, "golden_answers", where), where, "golden_answers")
        source = record_source(record, path)
        tasks.append(
            common_pb2.PromptTask(
                id=task_id(source, question),
                question=question,
                golden_answers=answers,
                supporting_titles=list(record.get("supporting_titles") or []),
                data_source=source,
                mode=search_mode,  # type: ignore[arg-type]
                question_type=question_type(record, source),
            )
        )
    return tasks


def write_parquet(tasks: Sequence[common_pb2.PromptTask], path: Path, split: str = "train") -> None:
    """Writes tasks in Search-R1's parquet layout (the question also kept as its own column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for index, task in enumerate(tasks):
        prompt = question_prompt(task.question, mode_of(task.mode))
        rows.append(
            {
                "id": task.id,
                "question": task.question,
                "golden_answers": list(task.golden_answers),
                "data_source": task.data_source,
                "question_type": task.question_type,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": {"target": list(task.golden_answers)}},
                "extra_info": {"split": split, "index": index},
            }
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def read_parquet(path: Path, mode: str | int, limit: int | None = None) -> list[common_pb2.PromptTask]:
    """``PromptTask``s from a Search-R1 / RAG-R1 parquet file. Required: ``data_source``, ``prompt``
    (chat messages with a user turn), ``reward_model.ground_truth`` (``{"target": [...]}`` or a list or
    a string). The question comes from a ``question`` column when there is one, else from the prompt; its type
    from a ``question_type`` column (``write_parquet``'s) or ``shipped.question_type``'s rules."""
    import pyarrow.parquet as pq

    search_mode = parse_mode(mode)
    table = pq.read_table(path)
    tasks = []
    for row, record in enumerate(table.to_pylist()):
        if limit is not None and row >= limit:
            break
        where = f"{path}: row {row}"
        source = _require(record, "data_source", where)
        messages = _require(record, "prompt", where)
        user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user" and m.get("content")]
        if not user:
            raise ValueError(f"{where}: field 'prompt' has no user message with content")
        truth = _require(record, "reward_model.ground_truth", where)
        if isinstance(truth, dict):
            truth = _require(record, "reward_model.ground_truth.target", where)
        answers = _answers(truth, where, "reward_model.ground_truth")
        question = record.get("question") or question_from_prompt(user[-1]["content"])
        tasks.append(
            common_pb2.PromptTask(
                id=str(record.get("id") or task_id(source, question)),
                question=question,
                golden_answers=answers,
                data_source=source,
                mode=search_mode,  # type: ignore[arg-type]
                question_type=question_type(record, source),
            )
        )
    return tasks


def load_tasks(path: Path, mode: str | int, limit: int | None = None) -> list[common_pb2.PromptTask]:
    """Parquet by extension, JSONL (gzipped or not) otherwise."""
    if str(path).endswith(".parquet"):
        return read_parquet(path, mode, limit)
    return load_qa_tasks(path, mode, limit)


# -- SFT trajectories -------------------------------------------------------------------------------


def load_supported_questions(path: Path, limit: int | None = None) -> list[SupportedQuestion]:
    """Questions of ``ragr1.shipped.train_path(...)`` files with the titles of their supporting paragraphs."""
    out = []
    for lineno, record in read_jsonl_numbered(path, limit):
        where = f"{path}:{lineno}"
        question = _require(record, "question", where)
        answers = _answers(_require(record, "golden_answers", where), where, "golden_answers")
        paragraphs = _require(record, "paragraphs", where)
        gold: list[str] = []
        for i, p in enumerate(paragraphs):
            if "title" not in p:
                raise ValueError(f"{where}: missing field 'paragraphs[{i}].title'")
            if p.get("is_supporting"):
                gold.append(p["title"])
        if not gold:
            raise ValueError(f"{where}: no paragraph has 'is_supporting' set")
        source = record_source(record, path)
        out.append(SupportedQuestion(question, answers, gold, source, question_type(record, source)))
    return out


def render_prompt_ids(tokenizer: Tokenizer, question: str, mode: Mode) -> list[int]:
    """The prompt token ids exactly as the policy's loop renders them (chat template, generation prompt)."""
    return chat_prompt_ids(tokenizer, question_prompt(question, mode))


def tokenize_segments(
    tokenizer: Tokenizer, prompt_ids: list[int], segments: Iterable[Piece], eos_id: int | None
) -> TokenSequence:
    """Each piece tokenised on its own, as the loop tokenises what it inserts; the mask marks generated
    pieces. The end-of-sequence token closes the answer turn, as the chat template ends a reply."""
    response: list[int] = []
    mask: list[int] = []
    for text, generated in segments:
        ids = tokenizer.encode(text, add_special_tokens=False)
        response += ids
        mask += [int(generated)] * len(ids)
    if eos_id is not None:
        response.append(eos_id)
        mask.append(1)
    return TokenSequence(prompt_ids, response, mask)


@dataclasses.dataclass(frozen=True)
class SFTTrajectory:
    """One SFT trajectory as text: the question, its mode, and the response in (text, generated) pieces;
    where the question came from and what its search did, for the record of what SFT trained on."""

    question: str
    mode: Mode
    segments: list[Piece]
    source: str = ""
    question_type: str = ""
    # Search calls and queries of the response (0 in no-retrieval mode).
    rounds: int = 0
    queries: int = 0

    def to_record(self) -> dict[str, Any]:
        return {"question": self.question, "mode": self.mode.value, "source": self.source,
                "question_type": self.question_type, "rounds": self.rounds, "queries": self.queries,
                "segments": [{"text": text, "generated": generated} for text, generated in self.segments]}


def load_trajectories(path: Path, limit: int | None = None) -> list[SFTTrajectory]:
    """Trajectories written by ``ragr1 data prepare`` (``sft.jsonl``); a bad record names its line."""
    out = []
    for lineno, record in read_jsonl_numbered(path, limit):
        where = f"{path}:{lineno}"
        question = _require(record, "question", where)
        try:
            mode = Mode.parse(str(_require(record, "mode", where)))
        except ValueError as exc:
            raise ValueError(f"{where}: field 'mode': {exc}") from None
        pieces = _require(record, "segments", where)
        if not isinstance(pieces, list) or not pieces:
            raise ValueError(f"{where}: field 'segments' must be a non-empty list")
        segments = []
        for i, piece in enumerate(pieces):
            if not isinstance(piece, dict) or not isinstance(piece.get("text"), str) or "generated" not in piece:
                raise ValueError(f"{where}: field 'segments[{i}]' needs 'text' and 'generated'")
            segments.append((piece["text"], bool(piece["generated"])))
        out.append(SFTTrajectory(str(question), mode, segments, str(record.get("source") or ""),
                                 str(record.get("question_type") or ""), int(record.get("rounds") or 0),
                                 int(record.get("queries") or 0)))
    return out


def is_trajectory_file(path: Path) -> bool:
    """True for a prepared trajectories file (its records have ``segments``), False for a QA file."""
    for _lineno, record in read_jsonl_numbered(path, limit=1):
        return "segments" in record
    return False


def tokenize_trajectories(tokenizer: Any, trajectories: Sequence[SFTTrajectory]) -> list[TokenSequence]:
    return [
        tokenize_segments(tokenizer, render_prompt_ids(tokenizer, t.question, t.mode), t.segments,
                          tokenizer.eos_token_id)
        for t in trajectories
    ]
