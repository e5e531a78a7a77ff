"""Clients of the retriever: ``RetrieverClient`` (blocking) and ``AsyncRetrieverClient`` (asyncio), twins.
Every call takes a ``timeout`` in seconds (its gRPC deadline; ``None``: the client's default) and raises
``ragr1.errors.ServiceCallError`` when it fails.

    with RetrieverClient("127.0.0.1:50051") as retriever:
        reply = retriever.search(["who wrote hamlet", "hamlet author"], top_k=3)
        for result in reply.results:
            print([p.title for p in result.passages])

(The router's client of the shards, which sends embeddings, is ``shard_client.AsyncShardClient``.)
"""

from __future__ import annotations

from collections.abc import Sequence

from ragr1.services.common.client import AsyncClient, Client, flag, integer, integers, sequence_of, service_name
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc

DEFAULT_TIMEOUT_S = 10.0


def shard_health_service(shard: int) -> str:
    """The name under which the router's health service reports whether shard ``shard`` is ready."""
    return f"{service_name(retriever_pb2_grpc.RetrieverShardStub)}/{shard}"


def _search_request(
    queries: Sequence[str], top_k: int, groups: Sequence[int], dedup_within_group: bool, omit_text: bool
) -> retriever_pb2.SearchRequest:
    return retriever_pb2.SearchRequest(
        queries=sequence_of("queries", queries, str),
        top_k=integer("top_k", top_k),
        groups=integers("groups", groups),
        dedup_within_group=flag("dedup_within_group", dedup_within_group),
        omit_text=flag("omit_text", omit_text),
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
        """The ``top_k`` passages of every query, in order (``groups``: one group id per query; with
        ``dedup_within_group`` a passage appears once per group)."""
        return self._call(
            "Search", lambda: _search_request(queries, top_k, groups, dedup_within_group, omit_text), timeout
        )

    def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return self._call("Info", retriever_pb2.InfoRequest(), timeout)

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
        """See ``RetrieverClient.search``."""
        return await self._call(
            "Search", lambda: _search_request(queries, top_k, groups, dedup_within_group, omit_text), timeout
        )

    async def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return await self._call("Info", retriever_pb2.InfoRequest(), timeout)

    async def shards_ready(self, timeout: float | None = None) -> list[bool]:
        """See ``RetrieverClient.shards_ready``."""
        deadline = self.timeout if timeout is None else timeout
        count = (await self.info(timeout)).num_shards
        return [await self.health(deadline, shard_health_service(s)) for s in range(count)]
