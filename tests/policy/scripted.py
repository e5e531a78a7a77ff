"""Test doubles for the agent loop only (the issue allows a scripted engine for the loop's tests).

``ScriptedEngine`` answers each request with the next scripted turn of the question found in its
prompt, tokenised with the real SmolLM2 tokenizer, cut after the first stop string as a real engine
does. ``ScriptedSearch`` returns made-up passages per query and records every call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

from ragr1.protocol.information import Passage
from ragr1.protocol.prompts import Tokenizer
from ragr1.services.policy.agent import Generation, GenerationRequest, Sampling

_QUESTION = re.compile(r"Question: (.*?)\n")


class ScriptedEngine:
    def __init__(self, tokenizer: Tokenizer, script: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.turns: dict[str, int] = {}
        self.batch_sizes: list[int] = []
        # Per question, every generation handed out, in order.
        self.generated: dict[str, list[Generation]] = {}
        self.aborts = 0

    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: Sampling, stop: Sequence[str]
    ) -> list[Generation]:
        self.batch_sizes.append(len(requests))
        out = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
            match = _QUESTION.search(prompt)
            assert match, "prompt without a question"
            question = match.group(1)
            turn = self.turns.get(question, 0)
            self.turns[question] = turn + 1
            text = self.script[question][min(turn, len(self.script[question]) - 1)]
            ended_by = None
            cuts = [(text.find(s) + len(s), s) for s in stop if s in text]
            if cuts:
                end, ended_by = min(cuts)
                text = text[:end]
            ids = self.tokenizer.encode(text, add_special_tokens=False)[: request.max_tokens]
            logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
            generation = Generation(ids, logprobs, ended_by, "stop" if ended_by else "length", 0.001)
            self.generated.setdefault(question, []).append(generation)
            out.append(generation)
        return out

    async def abort_all(self) -> None:
        self.aborts += 1

    async def reload_weights(self, checkpoint: Path) -> None:
        raise AssertionError(f"the scripted engine has no weights to replace with {checkpoint}")


class ScriptedSearch:
    def __init__(self, *, fail: Exception | None = None, hang: bool = False, top_k: int = 2) -> None:
        self.calls: list[tuple[list[str], list[int]]] = []
        self.fail = fail
        self.hang = hang
        self.top_k = top_k

    async def search(self, queries: Sequence[str], groups: Sequence[int]) -> list[list[Passage]]:
        self.calls.append((list(queries), list(groups)))
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail is not None:
            raise self.fail
        return [
            [
                Passage(f"{q}-{i}", f"Page {q} {i}", f"Facts about {q}, part {i}.", 1.0 - i)
                for i in range(self.top_k)
            ]
            for q in queries
        ]
