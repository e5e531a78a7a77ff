"""Scoring as Search-R1 scores its validation set, so a Search-R1 or RAG-R1 checkpoint scores here as there.

Search-R1 decodes the prompt and the response together and takes the last ``<answer>…</answer>`` of the
whole text when there are at least two. Its comment expects the prompt to hold one, but its prompt holds
two ("inside <answer> and </answer>" and "<answer> Beijing </answer>"): a response without an answer is
scored as the answer "Beijing", and the text searched includes the inserted ``<information>`` and
feedback (whose "between <answer> and </answer>" reads as the answer "and"). Kept as it is, since
the point is to score as Search-R1 scores. Exact match compares
the SQuAD-normalised answer with every normalised gold; cover-EM (Search-R1's ``subem_check``, the
"cover exact match" papers report) asks whether a normalised gold is a substring of the normalised
answer. Scores go per ``data_source`` under Search-R1's names (``val/test_score/<source>``), to which
the shipped files' names are mapped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragr1.protocol.prompts import Mode, question_prompt
from ragr1.services.reward.answers import normalize_answer, normalized_golds, token_f1

# The seven benchmarks of Search-R1's and RAG-R1's tables, as their parquet files name them (FlashRAG's).
SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# Other names of the same sets: the shipped evaluation files' (DeepResearcher's) and common short ones.
ALIASES = {"tq": "triviaqa", "trivia_qa": "triviaqa", "2wiki": "2wikimultihopqa", "2wikimqa": "2wikimultihopqa"}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def source_name(data_source: str) -> str:
    """Search-R1's name of a data source; a name it does not know is kept as it is."""
    lowered = data_source.strip().lower()
    return ALIASES.get(lowered, lowered if lowered in SOURCES else data_source)


def extract_answer(prompt: str, response: str) -> str | None:
    """The last answer of prompt and response, if there are two or more (Search-R1's ``extract_solution``)."""
    matches = _ANSWER.findall(prompt + response)
    return matches[-1].strip() if len(matches) > 1 else None


def exact_match(answer: str | None, golden_answers: Sequence[str]) -> float:
    if answer is None:
        return 0.0
    normalized = normalize_answer(answer)
    return 1.0 if any(normalize_answer(g) == normalized for g in golden_answers) else 0.0


def cover_match(answer: str | None, golden_answers: Sequence[str]) -> float:
    if answer is None:
        return 0.0
    normalized = normalize_answer(answer)
    return 1.0 if any(normalize_answer(g) in normalized for g in golden_answers) else 0.0


def score(question: str, response: str, golden_answers: Sequence[str]) -> tuple[str | None, float, float, float]:
    """Search-R1's answer of a trajectory in its mode (the prompt rebuilt from the question), its EM,
    token F1 and cover-EM."""
    answer = extract_answer(question_prompt(question, Mode.SEARCH_R1), response)
    f1 = token_f1(answer, normalized_golds(golden_answers)) if answer is not None else 0.0
    return answer, exact_match(answer, golden_answers), f1, cover_match(answer, golden_answers)
