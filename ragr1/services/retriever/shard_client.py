"""The router's client of the shards: embeddings in, hits out (numpy), so not among the clients that
install alone (``client.py``)."""

from __future__ import annotations

import numpy as np

from ragr1.services.common.client import AsyncClient
from ragr1.services.retriever import convert
from ragr1.services.retriever.client import DEFAULT_TIMEOUT_S
from ragr1.services.retriever.results import Hit
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc


class AsyncShardClient(AsyncClient[retriever_pb2_grpc.RetrieverShardStub]):
    """One shard over gRPC, as the router's ``ShardBackend``."""

    stub_type = retriever_pb2_grpc.RetrieverShardStub
    default_timeout = DEFAULT_TIMEOUT_S

    async def search(
        self, embeddings: np.ndarray, top_k: int, omit_text: bool = False, timeout: float | None = None
    ) -> list[list[Hit]]:
        reply = await self._call("SearchShard", convert.embeddings_to_pb(embeddings, top_k, omit_text), timeout)
        return convert.results_from_pb(reply.results)

    async def info(self, timeout: float | None = None) -> retriever_pb2.ShardInfoResponse:
        return await self._call("ShardInfo", retriever_pb2.ShardInfoRequest(), timeout)
