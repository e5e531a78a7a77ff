"""The retriever's two servers: a shard (one FAISS index shard) and the router (gRPC + HTTP), each
built by its ``build_*_server(config)`` and run by ``serve(config)``, which picks by the config's type."""

from __future__ import annotations

import asyncio
import logging
import time

from grpc_health.v1 import health_pb2

from ragr1.services.common.server import GrpcServer
from ragr1.services.retriever import metrics
from ragr1.services.retriever.client import shard_health_service
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.retriever.encoder import Encoder
from ragr1.services.retriever.http_api import start_http
from ragr1.services.retriever.manifest import LoadedManifest, ManifestMismatch
from ragr1.services.retriever.router import QueryEncoder, Router
from ragr1.services.retriever.servicer import RetrieverServicer, RetrieverShardServicer
from ragr1.services.retriever.shard import ShardSearcher
from ragr1.services.retriever.shard_client import AsyncShardClient
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc

log = logging.getLogger(__name__)


def process_age() -> float:
    """Seconds since this process started (imports included: they are part of a shard's start-up)."""
    import psutil

    return max(time.time() - psutil.Process().create_time(), 0.0)


async def build_shard_server(config: ShardConfig) -> GrpcServer:
    """The shard's index loaded (memory-mapped by default), its checksum verified now or beside the
    server (a mismatch stops it with exit code 1)."""
    manifest = LoadedManifest(config.index)  # type: ignore[arg-type]
    searcher = ShardSearcher(manifest, config.shard, config.shard_settings())
    m = manifest.manifest
    info = retriever_pb2.ShardInfoResponse(
        shard=config.shard,
        num_shards=m.num_shards,
        num_passages=searcher.num_passages,
        dim=m.dim,
        index_type=m.index.index_type,
        encoder=m.encoder.name,
        manifest_sha256=manifest.sha256,
    )
    server = GrpcServer(config, f"retriever-shard-{config.shard}")
    server.add(retriever_pb2_grpc.add_RetrieverShardServicer_to_server, RetrieverShardServicer(searcher, info))

    async def verify_checksum() -> None:
        await asyncio.get_running_loop().run_in_executor(None, manifest.check_shard_checksum, config.shard)
        log.info("shard %d: checksum verified", config.shard)
        await asyncio.Event().wait()  # verified: serve on; only a mismatch (raised above) stops the shard

    if config.checksum == "background":
        server.beside(verify_checksum, "the checksum check")
    server.on_stop(searcher.aclose)
    ready = process_age()
    metrics.SHARD_TIME_TO_READY.set(ready)
    metrics.SHARD_INDEX_MMAP.set(1 if config.mmap else 0)
    log.info("shard %d: ready %.2f s after the process started", config.shard, ready)
    return server


async def check_shards(shards: list[AsyncShardClient], manifest: LoadedManifest, wait_s: float) -> None:
    """Waits for every shard's ShardInfo; refuses shards of another index or in the wrong position.

    A shard still unreachable after ``wait_s`` is logged and left to the per-call failure handling.
    """
    deadline = time.monotonic() + wait_s
    for position, shard in enumerate(shards):
        while True:
            try:
                info = await shard.info(timeout=max(0.5, min(2.0, deadline - time.monotonic())))
                break
            except Exception as exc:  # not up yet: retry until the deadline
                if time.monotonic() >= deadline:
                    log.warning(
                        "shard %d at %s not reachable (%s); serving without it for now",
                        position,
                        shard.target,
                        exc,
                    )
                    info = None
                    break
                await asyncio.sleep(0.2)
        if info is None:
            continue
        if info.manifest_sha256 != manifest.sha256:
            raise ManifestMismatch(
                f"shard at {shard.target} serves an index with manifest sha256 "
                f"{info.manifest_sha256[:12]}, this router's is {manifest.sha256[:12]}"
            )
        if info.shard != position or info.num_shards != len(shards):
            raise ManifestMismatch(
                f"shard at {shard.target} is shard {info.shard} of {info.num_shards}, "
                f"listed as shard {position} of {len(shards)}"
            )


async def watch_shards(shards: list[AsyncShardClient], server: GrpcServer, interval_s: float) -> None:
    """Polls every shard's health for ever; reports each as the router's health service
    ``ragr1.v1.RetrieverShard/<i>`` and as ``ragr1_retriever_shard_ready{shard}``."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def check(shard: AsyncShardClient) -> bool:
        try:
            return await shard.health(timeout=max(interval_s, 0.5))
        except Exception:  # down, unreachable or late: not ready
            return False

    while True:
        states = await asyncio.gather(*(check(s) for s in shards))
        for i, up in enumerate(states):
            await server.health.set(shard_health_service(i), serving if up else not_serving)
            metrics.SHARD_READY.labels(str(i)).set(1 if up else 0)
        await asyncio.sleep(interval_s)


async def build_router_server(config: RouterConfig, encoder: QueryEncoder | None = None) -> GrpcServer:
    """The shards checked (same index, right positions), the query encoder warm, the HTTP endpoint up;
    the shards' health watched beside the server. ``encoder``: the index's own unless given (a benchmark
    gives precomputed query vectors, to measure the rest of the router without the encoder's cost)."""
    manifest = LoadedManifest(config.index)  # type: ignore[arg-type]
    m = manifest.manifest
    addresses = config.shard_addresses(m.num_shards)
    if len(addresses) != m.num_shards:
        raise ValueError(f"--shards lists {len(addresses)} address(es), the index has {m.num_shards} shard(s)")
    shards = [AsyncShardClient(target) for target in addresses]
    await check_shards(shards, manifest, config.shard_wait_s)
    if encoder is None:
        encoder = Encoder(
            m.encoder,
            device=config.device,
            export_dir=manifest.encoder_dir(config.encoder_backend),
            threads=config.encoder_threads,
        )
    router = Router(encoder, shards, config.router_settings(), lower_is_better=m.index.metric == "l2")
    await router.embed(["warm-up"])
    info = retriever_pb2.InfoResponse(
        encoder=m.encoder.name,
        dim=m.dim,
        index_type=m.index.index_type,
        num_shards=m.num_shards,
        num_passages=m.num_passages,
        max_queries=config.max_queries,
        max_top_k=config.max_top_k,
        max_query_chars=config.max_query_chars,
        corpus_sha256=m.store_sha256,
        manifest_sha256=manifest.sha256,
    )
    server = GrpcServer(config, "retriever")
    server.add(retriever_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(router, info))
    server.beside(lambda: watch_shards(shards, server, config.shard_health_interval_s), "the shard health watch")
    http = None
    if config.http_port >= 0:
        http, http_port = await start_http(router, config.host, config.http_port)
        print(f"READY retriever-http http=http://{config.host}:{http_port}/retrieve", flush=True)

    async def close() -> None:
        if http is not None:
            await http.cleanup()
        await router.aclose()
        for shard in shards:
            await shard.close()

    server.on_stop(close)
    return server


async def build_server(config: ShardConfig | RouterConfig) -> GrpcServer:
    if isinstance(config, ShardConfig):
        return await build_shard_server(config)
    return await build_router_server(config)


async def serve(config: ShardConfig | RouterConfig) -> int:
    server = await build_server(config)
    return await server.serve()
