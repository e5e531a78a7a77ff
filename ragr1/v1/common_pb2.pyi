from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_UNSPECIFIED: _ClassVar[SearchMode]
    SEARCH_MODE_SINGLE: _ClassVar[SearchMode]
    SEARCH_MODE_MULTI: _ClassVar[SearchMode]
    SEARCH_MODE_NONE: _ClassVar[SearchMode]
    SEARCH_MODE_SEARCH_R1: _ClassVar[SearchMode]

class SpanKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPAN_KIND_UNSPECIFIED: _ClassVar[SpanKind]
    SPAN_KIND_GENERATED: _ClassVar[SpanKind]
    SPAN_KIND_INFORMATION: _ClassVar[SpanKind]
    SPAN_KIND_FEEDBACK: _ClassVar[SpanKind]

class TrajectoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_STATUS_UNSPECIFIED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_ANSWERED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_NO_ANSWER: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TRUNCATED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_RETRIEVAL_ERROR: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_ABORTED: _ClassVar[TrajectoryStatus]
SEARCH_MODE_UNSPECIFIED: SearchMode
SEARCH_MODE_SINGLE: SearchMode
SEARCH_MODE_MULTI: SearchMode
SEARCH_MODE_NONE: SearchMode
SEARCH_MODE_SEARCH_R1: SearchMode
SPAN_KIND_UNSPECIFIED: SpanKind
SPAN_KIND_GENERATED: SpanKind
SPAN_KIND_INFORMATION: SpanKind
SPAN_KIND_FEEDBACK: SpanKind
TRAJECTORY_STATUS_UNSPECIFIED: TrajectoryStatus
TRAJECTORY_STATUS_ANSWERED: TrajectoryStatus
TRAJECTORY_STATUS_NO_ANSWER: TrajectoryStatus
TRAJECTORY_STATUS_TRUNCATED: TrajectoryStatus
TRAJECTORY_STATUS_RETRIEVAL_ERROR: TrajectoryStatus
TRAJECTORY_STATUS_ABORTED: TrajectoryStatus

class Passage(_message.Message):
    __slots__ = ("id", "title", "text", "score", "shard")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    text: str
    score: float
    shard: int
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., shard: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_tokens", "seed", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class RewardParts(_message.Message):
    __slots__ = ("total", "exact_match", "f1", "format", "process", "decomposition", "search_count", "extracted_answer", "reasons")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXACT_MATCH_FIELD_NUMBER: _ClassVar[int]
    F1_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    DECOMPOSITION_FIELD_NUMBER: _ClassVar[int]
    SEARCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    total: float
    exact_match: float
    f1: float
    format: float
    process: float
    decomposition: float
    search_count: float
    extracted_answer: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, total: _Optional[float] = ..., exact_match: _Optional[float] = ..., f1: _Optional[float] = ..., format: _Optional[float] = ..., process: _Optional[float] = ..., decomposition: _Optional[float] = ..., search_count: _Optional[float] = ..., extracted_answer: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class ResponseSpan(_message.Message):
    __slots__ = ("text", "kind")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    text: str
    kind: SpanKind
    def __init__(self, text: _Optional[str] = ..., kind: _Optional[_Union[SpanKind, str]] = ...) -> None: ...

class PromptTask(_message.Message):
    __slots__ = ("id", "question", "golden_answers", "supporting_titles", "data_source", "mode", "admitted_at_version", "group_id", "num_samples", "question_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    GOLDEN_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTING_TITLES_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    QUESTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    question: str
    golden_answers: _containers.RepeatedScalarFieldContainer[str]
    supporting_titles: _containers.RepeatedScalarFieldContainer[str]
    data_source: str
    mode: SearchMode
    admitted_at_version: int
    group_id: str
    num_samples: int
    question_type: str
    def __init__(self, id: _Optional[str] = ..., question: _Optional[str] = ..., golden_answers: _Optional[_Iterable[str]] = ..., supporting_titles: _Optional[_Iterable[str]] = ..., data_source: _Optional[str] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., admitted_at_version: _Optional[int] = ..., group_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., question_type: _Optional[str] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("id", "task_id", "group_id", "prompt_token_ids", "response_token_ids", "loss_mask", "behaviour_logprobs", "reward", "policy_version", "num_turns", "retrieval_rounds", "num_queries", "status", "error", "response_text", "generation_seconds", "retrieval_seconds", "question", "golden_answers", "mode", "data_source", "sampling", "spans", "question_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUERIES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    GOLDEN_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    QUESTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    task_id: str
    group_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    behaviour_logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: RewardParts
    policy_version: int
    num_turns: int
    retrieval_rounds: int
    num_queries: int
    status: TrajectoryStatus
    error: str
    response_text: str
    generation_seconds: float
    retrieval_seconds: float
    question: str
    golden_answers: _containers.RepeatedScalarFieldContainer[str]
    mode: SearchMode
    data_source: str
    sampling: SamplingParams
    spans: _containers.RepeatedCompositeFieldContainer[ResponseSpan]
    question_type: str
    def __init__(self, id: _Optional[str] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., behaviour_logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[_Union[RewardParts, _Mapping]] = ..., policy_version: _Optional[int] = ..., num_turns: _Optional[int] = ..., retrieval_rounds: _Optional[int] = ..., num_queries: _Optional[int] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., error: _Optional[str] = ..., response_text: _Optional[str] = ..., generation_seconds: _Optional[float] = ..., retrieval_seconds: _Optional[float] = ..., question: _Optional[str] = ..., golden_answers: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., data_source: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., spans: _Optional[_Iterable[_Union[ResponseSpan, _Mapping]]] = ..., question_type: _Optional[str] = ...) -> None: ...
