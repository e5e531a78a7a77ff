from ragr1.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchRequest(_message.Message):
    __slots__ = ("queries", "top_k", "groups", "dedup_within_group", "omit_text")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WITHIN_GROUP_FIELD_NUMBER: _ClassVar[int]
    OMIT_TEXT_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    dedup_within_group: bool
    omit_text: bool
    def __init__(self, queries: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., dedup_within_group: _Optional[bool] = ..., omit_text: _Optional[bool] = ...) -> None: ...

class QueryResult(_message.Message):
    __slots__ = ("passages",)
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Passage]
    def __init__(self, passages: _Optional[_Iterable[_Union[_common_pb2.Passage, _Mapping]]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("results", "partial", "missing_shards")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    MISSING_SHARDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[QueryResult]
    partial: bool
    missing_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[_Union[QueryResult, _Mapping]]] = ..., partial: _Optional[bool] = ..., missing_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("encoder", "dim", "index_type", "num_shards", "num_passages", "max_queries", "max_top_k", "max_query_chars", "corpus_sha256", "manifest_sha256")
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INDEX_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_QUERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_QUERY_CHARS_FIELD_NUMBER: _ClassVar[int]
    CORPUS_SHA256_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    encoder: str
    dim: int
    index_type: str
    num_shards: int
    num_passages: int
    max_queries: int
    max_top_k: int
    max_query_chars: int
    corpus_sha256: str
    manifest_sha256: str
    def __init__(self, encoder: _Optional[str] = ..., dim: _Optional[int] = ..., index_type: _Optional[str] = ..., num_shards: _Optional[int] = ..., num_passages: _Optional[int] = ..., max_queries: _Optional[int] = ..., max_top_k: _Optional[int] = ..., max_query_chars: _Optional[int] = ..., corpus_sha256: _Optional[str] = ..., manifest_sha256: _Optional[str] = ...) -> None: ...

class SearchShardRequest(_message.Message):
    __slots__ = ("embeddings", "num_queries", "dim", "top_k", "omit_text")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUERIES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    OMIT_TEXT_FIELD_NUMBER: _ClassVar[int]
    embeddings: bytes
    num_queries: int
    dim: int
    top_k: int
    omit_text: bool
    def __init__(self, embeddings: _Optional[bytes] = ..., num_queries: _Optional[int] = ..., dim: _Optional[int] = ..., top_k: _Optional[int] = ..., omit_text: _Optional[bool] = ...) -> None: ...

class SearchShardResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[QueryResult]
    def __init__(self, results: _Optional[_Iterable[_Union[QueryResult, _Mapping]]] = ...) -> None: ...

class ShardInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardInfoResponse(_message.Message):
    __slots__ = ("shard", "num_shards", "num_passages", "dim", "index_type", "encoder", "manifest_sha256")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INDEX_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    shard: int
    num_shards: int
    num_passages: int
    dim: int
    index_type: str
    encoder: str
    manifest_sha256: str
    def __init__(self, shard: _Optional[int] = ..., num_shards: _Optional[int] = ..., num_passages: _Optional[int] = ..., dim: _Optional[int] = ..., index_type: _Optional[str] = ..., encoder: _Optional[str] = ..., manifest_sha256: _Optional[str] = ...) -> None: ...
