from ragr1.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreItem(_message.Message):
    __slots__ = ("id", "response", "golden_answers", "supporting_titles", "retrieved", "retrieved_rounds", "spans", "question_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    GOLDEN_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTING_TITLES_FIELD_NUMBER: _ClassVar[int]
    RETRIEVED_FIELD_NUMBER: _ClassVar[int]
    RETRIEVED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    QUESTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    response: str
    golden_answers: _containers.RepeatedScalarFieldContainer[str]
    supporting_titles: _containers.RepeatedScalarFieldContainer[str]
    retrieved: _containers.RepeatedCompositeFieldContainer[_common_pb2.Passage]
    retrieved_rounds: _containers.RepeatedScalarFieldContainer[int]
    spans: _containers.RepeatedCompositeFieldContainer[_common_pb2.ResponseSpan]
    question_type: str
    def __init__(self, id: _Optional[str] = ..., response: _Optional[str] = ..., golden_answers: _Optional[_Iterable[str]] = ..., supporting_titles: _Optional[_Iterable[str]] = ..., retrieved: _Optional[_Iterable[_Union[_common_pb2.Passage, _Mapping]]] = ..., retrieved_rounds: _Optional[_Iterable[int]] = ..., spans: _Optional[_Iterable[_Union[_common_pb2.ResponseSpan, _Mapping]]] = ..., question_type: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[_common_pb2.RewardParts]
    def __init__(self, scores: _Optional[_Iterable[_Union[_common_pb2.RewardParts, _Mapping]]] = ...) -> None: ...
