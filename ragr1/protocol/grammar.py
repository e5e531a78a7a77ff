"""The tag grammar: one turn's action, and a whole response parsed into think/search/information/answer.

Only what the model generated is ever read as its action. The system inserts two kinds of text into a
trajectory, and both may contain tags: ``<information>`` blocks hold retrieved passages (which can
quote anything), and the invalid-action feedback spells out ``<search> and </search>`` and
``<answer> and </answer>``. A caller that knows who wrote what passes ``Span``s and gets exactly that;
a caller with one plain text gets ``<information>`` blocks treated as inserted (their tags opaque).

The parser recovers from mistakes (an unclosed or nested tag restarts at the newer tag), so that the
answer of a sloppy response is still its last ``<answer>…</answer>``, and records every mistake for the
format reward.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterator, Sequence

SEARCH_STOP = "</search>"
ANSWER_STOP = "</answer>"
# Generation stops at either; the stop string stays in the generated text.
STOP_STRINGS = (SEARCH_STOP, ANSWER_STOP)

INFORMATION_OPEN = "\n<information>\n"
INFORMATION_CLOSE = "\n</information>\n"

_TAG = re.compile(r"<(/?)(think|search|information|answer)>")
_INFORMATION_BLOCK = re.compile(r"<information>(.*?)</information>", re.DOTALL)
# The first complete <search>...</search> or <answer>...</answer> of a turn is its action.
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


# -- one turn --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Action:
    """What one turn asked for: ``kind`` is "search", "answer" or "invalid"."""

    kind: str
    content: str = ""
    queries: tuple[str, ...] = ()
    # Queries past the cap, which are not searched (RAG-R1 searches every one).
    dropped: int = 0


def split_queries(content: str, separator: str) -> tuple[str, ...]:
    """The queries of one ``<search>``'s content: cut at every ``separator`` (none: one query), stripped, empty
    ones dropped. The reward counts a search's queries by this same rule, so that it pays for the queries the
    loop searched."""
    parts = content.split(separator) if separator else [content]
    return tuple(q.strip() for q in parts if q.strip())


def parse_action(text: str, *, multi_query: bool, separator: str, max_queries: int) -> Action:
    """The action of one generated turn; queries split (multi-query), stripped and capped."""
    match = _ACTION.search(text)
    if match is None:
        return Action("invalid")
    kind, content = match.group(1), match.group(2).strip()
    if kind == "answer":
        return Action("answer", content)
    found = split_queries(content, separator if multi_query else "")
    queries = found[: max(1, max_queries) if multi_query else 1]
    if not queries:
        return Action("invalid", content)
    return Action("search", content, queries, len(found) - len(queries))


# -- a whole response ------------------------------------------------------------------------------
class SpanKind(enum.Enum):
    """Who wrote a piece of a response; the values match ``ragr1.v1.SpanKind``."""

    GENERATED = 1
    INFORMATION = 2
    FEEDBACK = 3


@dataclasses.dataclass(frozen=True)
class Span:
    text: str
    kind: SpanKind


@dataclasses.dataclass(frozen=True)
class Segment:
    tag: str
    content: str
    start: int  # offset of the opening tag in the parsed text
    end: int  # offset just after the closing tag


@dataclasses.dataclass
class ParsedResponse:
    """What the reward needs to know about a response."""

    segments: list[Segment]
    # Tag mistakes, as reason codes, in order of appearance (may repeat).
    errors: list[str]
    # Non-white-space text the model wrote between segments (before the answer).
    text_outside_tags: bool
    # Non-white-space text the model wrote after the last </answer>.
    text_after_answer: bool
    # Turns that held neither a search nor an answer (the system answered with its feedback).
    invalid_actions: int = 0

    @property
    def answer(self) -> str | None:
        """The content of the last closed ``<answer>`` segment, stripped; None if there is none."""
        for segment in reversed(self.segments):
            if segment.tag == "answer":
                return segment.content.strip()
        return None

    def contents(self, tag: str) -> list[str]:
        return [s.content for s in self.segments if s.tag == tag]

    def tag_sequence(self) -> str:
        """One letter per segment (t, s, i, a), for the order check."""
        return "".join(s.tag[0] for s in self.segments)


def split_information(text: str) -> list[Span]:
    """A plain response as spans: its ``<information>`` blocks inserted, the rest generated."""
    spans: list[Span] = []
    at = 0
    for match in _INFORMATION_BLOCK.finditer(text):
        if match.start() > at:
            spans.append(Span(text[at : match.start()], SpanKind.GENERATED))
        spans.append(Span(match.group(0), SpanKind.INFORMATION))
        at = match.end()
    if at < len(text):
        spans.append(Span(text[at:], SpanKind.GENERATED))
    return spans


def parse_response(text: str) -> ParsedResponse:
    """A response given as one text; its ``<information>`` blocks are taken as inserted."""
    return parse_spans(split_information(text))


@dataclasses.dataclass(frozen=True)
class _Event:
    kind: str  # "tag", "information" or "feedback"
    start: int
    end: int
    closing: bool = False
    name: str = ""


def _events(spans: Sequence[Span]) -> tuple[str, list[_Event]]:
    """The generated and information text laid end to end (feedback left out), and what happens where."""
    parts: list[str] = []
    events: list[_Event] = []
    offset = 0
    for span in spans:
        if span.kind is SpanKind.FEEDBACK:
            events.append(_Event("feedback", offset, offset))
            continue
        if span.kind is SpanKind.INFORMATION:
            events.append(_Event("information", offset, offset + len(span.text)))
        else:
            for m in _TAG.finditer(span.text):
                events.append(_Event("tag", offset + m.start(), offset + m.end(), m.group(1) == "/", m.group(2)))
        parts.append(span.text)
        offset += len(span.text)
    return "".join(parts), events


def _information_content(block: str) -> str:
    match = _INFORMATION_BLOCK.search(block)
    return (match.group(1) if match else block).strip("\n")


def parse_spans(spans: Sequence[Span]) -> ParsedResponse:
    """Segments of the model's tags in generated spans, with every information span as one segment."""
    text, events = _events(spans)
    segments: list[Segment] = []
    errors: list[str] = []
    invalid_actions = 0
    open_tag: str | None = None
    open_at = content_at = 0
    for event in events:
        if event.kind != "tag":
            # Inserted text ends the model's turn: a tag still open there was never closed.
            if open_tag is not None:
                errors.append("unclosed_tag")
                open_tag = None
            if event.kind == "feedback":
                invalid_actions += 1
            else:
                content = _information_content(text[event.start : event.end])
                segments.append(Segment("information", content, event.start, event.end))
            continue
        if event.name == "information":
            # Only the system inserts information; the model writing the tag is a format mistake.
            errors.append("generated_information_tag")
            continue
        if open_tag is None:
            if event.closing:
                errors.append("stray_closing_tag")
            else:
                open_tag, open_at, content_at = event.name, event.start, event.end
        elif event.closing and event.name == open_tag:
            segments.append(Segment(open_tag, text[content_at : event.start], open_at, event.end))
            open_tag = None
        elif event.closing:
            errors.append("mismatched_closing_tag")
        else:
            errors.append("nested_tag")
            open_tag, open_at, content_at = event.name, event.start, event.end
    if open_tag is not None:
        errors.append("unclosed_tag")
    answers = [s for s in segments if s.tag == "answer"]
    # Text after the answer is reported apart; an unclosed tag's content is not "outside".
    limit = answers[-1].start if answers else open_at if open_tag is not None else len(text)
    after_answer = bool(answers) and bool(text[answers[-1].end :].strip())
    outside = any(text[a:b].strip() for a, b in _gaps(segments, limit))
    return ParsedResponse(segments, errors, outside, after_answer, invalid_actions)


def _gaps(segments: Sequence[Segment], limit: int) -> Iterator[tuple[int, int]]:
    """The ranges before ``limit`` that no segment covers."""
    previous = 0
    for segment in segments:
        if segment.start >= limit:
            break
        yield previous, segment.start
        previous = segment.end
    yield previous, limit
