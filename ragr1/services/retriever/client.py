"""Clients of the retriever: ``RetrieverClient`` (sync), ``AsyncRetrieverClient``, and the router's
``AsyncShardClient`` for the shards. Every call takes a ``timeout`` in seconds (its gRPC deadline)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragr1.services.common.client import ChannelOptions, open_aio_channel, open_channel
from ragr1.services.retriever import convert
from ragr1.services.retriever.results import Hit
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc

DEFAULT_TIMEOUT_S = 10.0
SERVICE = "ragr1.v1.Retriever"
SHARD_SERVICE = "ragr1.v1.RetrieverShard"


def shard_health_service(shard: int) -> str:
    """The name under which the router's health service reports whether shard ``shard`` is ready."""
    return f"{SHARD_SERVICE}/{shard}"


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


class RetrieverClient:
    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._options = options or ChannelOptions()
        self._channel = open_channel(target, self._options)
        self._stub = retriever_pb2_grpc.RetrieverStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self.timeout = timeout

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
        return self._stub.Search(request, timeout=timeout or self.timeout, metadata=self._options.metadata())

    def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return self._stub.Info(
            retriever_pb2.InfoRequest(), timeout=timeout or self.timeout, metadata=self._options.metadata()
        )

    def health(self, timeout: float | None = None) -> bool:
        """True when the router reports SERVING."""
        reply = self._health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout or self.timeout)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def shards_ready(self, timeout: float | None = None) -> list[bool]:
        """Per shard, whether the router last saw it SERVING (its health service per shard)."""
        num_shards = self.info(timeout).num_shards
        ready = []
        for shard in range(num_shards):
            reply = self._health.Check(
                health_pb2.HealthCheckRequest(service=shard_health_service(shard)), timeout=timeout or self.timeout
            )
            ready.append(reply.status == health_pb2.HealthCheckResponse.SERVING)
        return ready

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetrieverClient:
    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._options = options or ChannelOptions()
        self._channel = open_aio_channel(target, self._options)
        self._stub = retriever_pb2_grpc.RetrieverStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self.timeout = timeout

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
        return await self._stub.Search(request, timeout=timeout or self.timeout, metadata=self._options.metadata())

    async def info(self, timeout: float | None = None) -> retriever_pb2.InfoResponse:
        return await self._stub.Info(
            retriever_pb2.InfoRequest(), timeout=timeout or self.timeout, metadata=self._options.metadata()
        )

    async def health(self, timeout: float | None = None) -> bool:
        reply = await self._health.Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout or self.timeout
        )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncShardClient:
    """One shard over gRPC, as the router's ``ShardBackend``."""

    def __init__(self, target: str, options: ChannelOptions | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self._options = options or ChannelOptions()
        self._channel = open_aio_channel(target, self._options)
        self._stub = retriever_pb2_grpc.RetrieverShardStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self.timeout = timeout

    async def search(
        self, embeddings: np.ndarray, top_k: int, omit_text: bool = False, timeout: float | None = None
    ) -> list[list[Hit]]:
        reply = await self._stub.SearchShard(
            convert.embeddings_to_pb(embeddings, top_k, omit_text),
            timeout=timeout or self.timeout,
            metadata=self._options.metadata(),
        )
        return convert.results_from_pb(reply.results)

    async def info(self, timeout: float | None = None) -> retriever_pb2.ShardInfoResponse:
        return await self._stub.ShardInfo(
            retriever_pb2.ShardInfoRequest(),
            timeout=timeout or self.timeout,
            metadata=self._options.metadata(),
        )

    async def health(self, timeout: float | None = None) -> bool:
        reply = await self._health.Check(
            health_pb2.HealthCheckRequest(service=SHARD_SERVICE), timeout=timeout or self.timeout
        )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self._channel.close()
