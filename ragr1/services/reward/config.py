"""Settings of the reward server: the common server settings plus the reward's composition and limits."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import setting
from ragr1.services.common.server import ServerConfig
from ragr1.services.reward.format_check import FormatWeights
from ragr1.services.reward.scoring import SCHEMES, Composition, RewardSettings, ScoreLimits

# The core's defaults are the one place these values are written.
_V03 = Composition.search_r1_v03()
_CORE = RewardSettings()
_WEIGHTS = Composition()


@dataclasses.dataclass
class RewardConfig(ServerConfig):
    port: int = setting(ports.REWARD, "gRPC port; 0 picks a free one")
    scheme: str = setting(
        _WEIGHTS.scheme, f"how the parts make the total: {' | '.join(SCHEMES)} (Search-R1's v0.3 reward)"
    )
    em_weight: float = setting(_WEIGHTS.em_weight, "weighted scheme: weight of exact match")
    f1_weight: float = setting(_WEIGHTS.f1_weight, "weighted scheme: weight of token F1")
    format_weight: float = setting(_WEIGHTS.format_weight, "weighted scheme: weight of the format score")
    process_weight: float = setting(
        _WEIGHTS.process_weight, "weighted scheme: weight of the retrieval-process score"
    )
    structure_format_score: float = setting(
        _V03.structure_format_score, "search_r1_v03: reward of a valid format with a wrong answer"
    )
    final_format_score: float = setting(
        _V03.final_format_score, "search_r1_v03: reward of an answer in an invalid format"
    )
    retrieval_score: float = setting(
        _V03.retrieval_score, "search_r1_v03: bonus of a valid format whose retrieval found gold evidence"
    )
    format_weight_tags: float = setting(
        _CORE.format_weights.tags, "format score: weight of 'tags closed, none nested'"
    )
    format_weight_order: float = setting(
        _CORE.format_weights.order, "format score: weight of 'think (search information think)* answer'"
    )
    format_weight_answer: float = setting(
        _CORE.format_weights.answer, "format score: weight of 'a closed <answer> exists'"
    )
    format_weight_clean: float = setting(
        _CORE.format_weights.clean,
        "format score: weight of 'no text outside tags or after the answer, no invalid-action turn'",
    )
    relevance_weight: float = setting(
        _CORE.relevance_weight,
        "process score: share given to the lexical relevance of the passages (rest: gold evidence)",
    )
    assistant_marker: str = setting(
        _CORE.assistant_marker,
        "start of the model's turn in the chat template; a response holding it is scored only after "
        "its last occurrence (reason prompt_in_response); empty: off",
    )
    max_items: int = setting(
        _CORE.limits.max_items, "most trajectories in one Score call (more: INVALID_ARGUMENT)"
    )
    max_response_chars: int = setting(
        _CORE.limits.max_response_chars,
        "longest response scored; longer ones score 0 with reason response_too_long",
    )
    max_rounds: int = setting(
        _CORE.limits.max_rounds, "largest retrieved_rounds value + 1 (more: INVALID_ARGUMENT)"
    )

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.relevance_weight <= 1.0:
            raise ValueError(f"relevance_weight must be in [0, 1], got {self.relevance_weight}")
        for name in ("max_items", "max_response_chars", "max_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        self.settings()  # the core's own checks (scheme, format weights) name their setting too

    def settings(self) -> RewardSettings:
        """The core's settings."""
        return RewardSettings(
            composition=Composition(
                scheme=self.scheme,
                em_weight=self.em_weight,
                f1_weight=self.f1_weight,
                format_weight=self.format_weight,
                process_weight=self.process_weight,
                structure_format_score=self.structure_format_score,
                final_format_score=self.final_format_score,
                retrieval_score=self.retrieval_score,
            ),
            format_weights=FormatWeights(
                tags=self.format_weight_tags,
                order=self.format_weight_order,
                answer=self.format_weight_answer,
                clean=self.format_weight_clean,
            ),
            limits=ScoreLimits(
                max_items=self.max_items,
                max_response_chars=self.max_response_chars,
                max_rounds=self.max_rounds,
            ),
            relevance_weight=self.relevance_weight,
            assistant_marker=self.assistant_marker,
        )
