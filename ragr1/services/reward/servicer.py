"""``ragr1.v1.Reward`` over gRPC: protobuf to plain calls and back."""

from __future__ import annotations

import asyncio
import time

import grpc

from ragr1.protocol.grammar import Span, SpanKind
from ragr1.services.common.errors import InvalidArgument
from ragr1.services.reward.metrics import record_batch
from ragr1.services.reward.scoring import Parts, RetrievedPassage, RewardScorer, ScoreInput, check_batch_size
from ragr1.v1 import common_pb2, reward_pb2, reward_pb2_grpc

_SPAN_KINDS = {kind.value for kind in SpanKind}


def to_input(index: int, item: reward_pb2.ScoreItem) -> ScoreInput:
    rounds = list(item.retrieved_rounds)
    if rounds and len(rounds) != len(item.retrieved):
        raise InvalidArgument(
            f"items[{index}].retrieved_rounds has {len(rounds)} entries but retrieved has "
            f"{len(item.retrieved)}; give one round per passage, or none (all in round 0)"
        )
    rounds = rounds or [0] * len(item.retrieved)
    spans = []
    for j, span in enumerate(item.spans):
        if span.kind not in _SPAN_KINDS:
            raise InvalidArgument(
                f"items[{index}].spans[{j}].kind is {span.kind}: say who wrote the span "
                "(SPAN_KIND_GENERATED, SPAN_KIND_INFORMATION or SPAN_KIND_FEEDBACK)"
            )
        spans.append(Span(span.text, SpanKind(span.kind)))
    return ScoreInput(
        id=item.id,
        response=item.response,
        spans=spans,
        golden_answers=list(item.golden_answers),
        supporting_titles=list(item.supporting_titles),
        retrieved=[RetrievedPassage(p.title, p.text, r) for p, r in zip(item.retrieved, rounds, strict=True)],
        question_type=item.question_type,
    )


def to_proto(parts: Parts) -> common_pb2.RewardParts:
    return common_pb2.RewardParts(
        total=parts.total,
        exact_match=parts.exact_match,
        f1=parts.f1,
        format=parts.format,
        process=parts.process,
        decomposition=parts.decomposition,
        search_count=parts.search_count,
        extracted_answer=parts.extracted_answer,
        reasons=parts.reasons,
    )


class RewardServicer(reward_pb2_grpc.RewardServicer):
    def __init__(self, scorer: RewardScorer) -> None:
        self.scorer = scorer

    async def Score(
        self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> reward_pb2.ScoreResponse:
        check_batch_size(len(request.items), self.scorer.settings)  # before converting them all
        items = [to_input(i, item) for i, item in enumerate(request.items)]
        start = time.perf_counter()
        # Off the event loop, so that health checks and other calls are answered meanwhile.
        results = await asyncio.to_thread(self.scorer.score_batch, items)
        record_batch(results, time.perf_counter() - start)
        return reward_pb2.ScoreResponse(scores=[to_proto(r) for r in results])
