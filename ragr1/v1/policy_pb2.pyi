from ragr1.v1 import common_pb2 as _common_pb2
from ragr1.v1 import retriever_pb2 as _retriever_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InFlightPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IN_FLIGHT_POLICY_UNSPECIFIED: _ClassVar[InFlightPolicy]
    IN_FLIGHT_POLICY_FINISH: _ClassVar[InFlightPolicy]
    IN_FLIGHT_POLICY_ABORT: _ClassVar[InFlightPolicy]
IN_FLIGHT_POLICY_UNSPECIFIED: InFlightPolicy
IN_FLIGHT_POLICY_FINISH: InFlightPolicy
IN_FLIGHT_POLICY_ABORT: InFlightPolicy

class RolloutRequest(_message.Message):
    __slots__ = ("tasks", "sampling")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.PromptTask]
    sampling: _common_pb2.SamplingParams
    def __init__(self, tasks: _Optional[_Iterable[_Union[_common_pb2.PromptTask, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class RolloutResponse(_message.Message):
    __slots__ = ("rollouts",)
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Rollout]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[_common_pb2.Rollout, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling", "apply_chat_template")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    APPLY_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedScalarFieldContainer[str]
    sampling: _common_pb2.SamplingParams
    apply_chat_template: bool
    def __init__(self, prompts: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., apply_chat_template: _Optional[bool] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "finish_reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("completions", "weight_version")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    weight_version: int
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., weight_version: _Optional[int] = ...) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("version", "checkpoint_path", "in_flight")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    version: int
    checkpoint_path: str
    in_flight: InFlightPolicy
    def __init__(self, version: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., in_flight: _Optional[_Union[InFlightPolicy, str]] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("version", "seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    seconds: float
    def __init__(self, version: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetWeightVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWeightVersionResponse(_message.Message):
    __slots__ = ("version", "checkpoint_path")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    version: int
    checkpoint_path: str
    def __init__(self, version: _Optional[int] = ..., checkpoint_path: _Optional[str] = ...) -> None: ...

class PolicyInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyInfoResponse(_message.Message):
    __slots__ = ("weight_version", "checkpoint_path", "checkpoint_sha256", "checkpoint_error", "mode", "max_turns", "max_queries_per_search", "query_separator", "top_k", "tokens_per_query", "max_model_len", "default_sampling", "engine_seed", "retriever", "retriever_error", "code_commit")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ERROR_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUERIES_PER_SEARCH_FIELD_NUMBER: _ClassVar[int]
    QUERY_SEPARATOR_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_QUERY_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SEED_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_FIELD_NUMBER: _ClassVar[int]
    RETRIEVER_ERROR_FIELD_NUMBER: _ClassVar[int]
    CODE_COMMIT_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    checkpoint_path: str
    checkpoint_sha256: str
    checkpoint_error: str
    mode: _common_pb2.SearchMode
    max_turns: int
    max_queries_per_search: int
    query_separator: str
    top_k: int
    tokens_per_query: int
    max_model_len: int
    default_sampling: _common_pb2.SamplingParams
    engine_seed: int
    retriever: _retriever_pb2.InfoResponse
    retriever_error: str
    code_commit: str
    def __init__(self, weight_version: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_sha256: _Optional[str] = ..., checkpoint_error: _Optional[str] = ..., mode: _Optional[_Union[_common_pb2.SearchMode, str]] = ..., max_turns: _Optional[int] = ..., max_queries_per_search: _Optional[int] = ..., query_separator: _Optional[str] = ..., top_k: _Optional[int] = ..., tokens_per_query: _Optional[int] = ..., max_model_len: _Optional[int] = ..., default_sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., engine_seed: _Optional[int] = ..., retriever: _Optional[_Union[_retriever_pb2.InfoResponse, _Mapping]] = ..., retriever_error: _Optional[str] = ..., code_commit: _Optional[str] = ...) -> None: ...
