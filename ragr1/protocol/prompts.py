"""What the model is told: RAG-R1's instructions per search mode, and the prompt as token ids.

The instructions follow RAG-R1's data scripts (multi-query mode, ``hotpotqa_search_mq.py``) and
Search-R1's (single-query mode), word for word apart from the query separator, which is configurable.
The no-retrieval mode (an evaluation baseline) drops the search sentences and keeps the rest.
The Search-R1 mode is Search-R1's own prompt as its data scripts write it (``make_prefix``), typo
included, with their question clean-up: a checkpoint trained on it is evaluated on the tokens it saw.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Mode(enum.Enum):
    """How the policy may search: one query per ``<search>``, up to N queries, or not at all."""

    SINGLE = "single"
    MULTI = "multi"
    NONE = "none"
    SEARCH_R1 = "search-r1"

    @classmethod
    def parse(cls, name: str) -> Mode:
        try:
            return cls(name)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown search mode {name!r}; use one of {names}") from None


_SEARCH_INSTRUCTIONS = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by {call} "
    "and it will return the top searched results{for_each} between <information> and </information>. "
    "You can search as many times as you want{cap}. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
_DIRECT_INSTRUCTIONS = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
_SEARCH_R1_INSTRUCTIONS = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
QUESTION_MARKER = "Question: "

_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}

# Search-R1 and RAG-R1 insert this when a turn holds neither a search nor an answer. It quotes the tags,
# which is why the reward parses only generated text (``grammar.parse_spans``).
INVALID_ACTION_FEEDBACK = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

# RAG-R1's defaults: "query_1,query_2" in the instructions, at most three queries per search.
QUERY_SEPARATOR = ","
MAX_QUERIES = 3
# RAG-R1's generation turns before the final answer turn: at most this many searches a trajectory.
MAX_TURNS = 4
# Queries are cut to this many characters before they are searched and shown.
MAX_QUERY_CHARS = 512


def question_prompt(
    question: str, mode: Mode, *, separator: str = QUERY_SEPARATOR, max_queries: int = MAX_QUERIES
) -> str:
    """The user message for one question in ``mode``."""
    question = question.strip()
    if mode is Mode.SEARCH_R1:
        # Their data scripts end every question with a question mark.
        return _SEARCH_R1_INSTRUCTIONS.format(question=question if question.endswith("?") else question + "?")
    if mode is Mode.NONE:
        return _DIRECT_INSTRUCTIONS.format(question=question)
    if mode is Mode.MULTI:
        count = _NUMBER_WORDS.get(max_queries, str(max_queries))
        return _SEARCH_INSTRUCTIONS.format(
            call=f"<search> query_1{separator}query_2 </search>",
            for_each=" for each query",
            cap=f", using up to {count} queries each time",
            question=question,
        )
    return _SEARCH_INSTRUCTIONS.format(call="<search> query </search>", for_each="", cap="", question=question)


def question_from_prompt(text: str) -> str:
    """The question inside a rendered prompt (what follows the last ``Question: ``), else the text."""
    _head, marker, tail = text.rpartition(QUESTION_MARKER)
    return (tail if marker else text).strip()


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the protocol uses."""

    eos_token_id: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def chat_prompt_ids(tokenizer: Tokenizer, user_message: str) -> list[int]:
    """``user_message`` as the one user turn of the model's chat template, ready for the assistant."""
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=True
    )
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) or hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]
