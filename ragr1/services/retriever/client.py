"""Clients of the retriever: ``RetrieverClient`` (sync), ``AsyncRetrieverClient``, and the router's
``AsyncShardClient`` for the shards. Every call takes a ``timeout`` in seconds (its gRPC deadline;
``None``: the client's default)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragr1.services.common.client import AsyncClient, Client, service_name
from ragr1.services.retriever import convert
from ragr1.services.retriever.results import Hit
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc

DEFAULT_TIMEOUT_S = 10.0


def shard_health_service(shard: int) -> str:
    """The name under which the router's health service reports whether shard ``shard`` is ready."""
    return f"{service_name(retriever_pb2_grpc.RetrieverShardStub)}/{shard}"


def _search_request(
    queries: Sequence[str], top_k: int, groups: Sequence[int], dedup_within_group: bool, omit_text: bool
) -> retriever_pb2.SearchRequest:
    return retriever_pb2.SearchRequest(
        queries=list(queries),
        top_k=top_k,
        groups=list(groups),
        dedup_within_group=dedup_within_group,
        omit_text=omit_text,
    )


class RetrieverClient(Client[retriever_pb2_grpc.RetrieverStub]):
    stub_type = retriever_pb2_grpc.RetrieverStub
    default_timeout = DEFAULT_TIMEOUT_S

    def search(
        self,
        queries: Sequence[str],
        top_k: int = 3,
        *,
        groups: Sequence[int] = (),
        dedup_within_group: bool = False,
        omit_text: bool = False,
        timeout: float | None = None,
    ) -> retriever_pb2.SearchResponse:
        request = _search_request(queries, top_k, groups, dedup_within_group, omit_text)
        return self.stub.Search(request, timeout=timeout)

    def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return self.stub.Info(retriever_pb2.InfoRequest(), timeout=timeout)

    def shards_ready(self, timeout: float | None = None) -> list[bool]:
        """Per shard, whether the router last saw it SERVING (its health service per shard)."""
        deadline = self.timeout if timeout is None else timeout
        return [self.health(deadline, shard_health_service(s)) for s in range(self.info(timeout).num_shards)]


class AsyncRetrieverClient(AsyncClient[retriever_pb2_grpc.RetrieverStub]):
    stub_type = retriever_pb2_grpc.RetrieverStub
    default_timeout = DEFAULT_TIMEOUT_S

    async def search(
        self,
        queries: Sequence[str],
        top_k: int = 3,
        *,
        groups: Sequence[int] = (),
        dedup_within_group: bool = False,
        omit_text: bool = False,
        timeout: float | None = None,
    ) -> retriever_pb2.SearchResponse:
        request = _search_request(queries, top_k, groups, dedup_within_group, omit_text)
        return await self.stub.Search(request, timeout=timeout)

    async def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return await self.stub.Info(retriever_pb2.InfoRequest(), timeout=timeout)


class AsyncShardClient(AsyncClient[retriever_pb2_grpc.RetrieverShardStub]):
    """One shard over gRPC, as the router's ``ShardBackend``."""

    stub_type = retriever_pb2_grpc.RetrieverShardStub
    default_timeout = DEFAULT_TIMEOUT_S

    async def search(
        self, embeddings: np.ndarray, top_k: int, omit_text: bool = False, timeout: float | None = None
    ) -> list[list[Hit]]:
        reply = await self.stub.SearchShard(convert.embeddings_to_pb(embeddings, top_k, omit_text), timeout=timeout)
        return convert.results_from_pb(reply.results)

    async def info(self, timeout: float | None = None) -> retriever_pb2.ShardInfoResponse:
        return await self.stub.ShardInfo(retriever_pb2.ShardInfoRequest(), timeout=timeout)
