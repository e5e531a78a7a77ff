"""The Search-R1-compatible HTTP endpoint: ``POST /retrieve`` over the same router core.

Search-R1, RAG-R1 and verl agent code send ``{"queries": [...], "topk": k, "return_scores": true}``
and read ``{"result": [[{"document": {"id", "contents"}, "score"}]]}`` (``[[document]]`` without
scores), so they can point at this retriever unchanged. Errors answer ``{"detail": message}`` with
the same message as gRPC: 400 for a body that is not JSON, 422 for a broken limit, 503/504 for
shards down or a deadline missed. ``partial`` and ``missing_shards`` are added when shards are
missing and the router is configured to answer anyway.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from ragr1.services.common.errors import DeadlineExceeded, InvalidArgument, ServiceError, Unavailable
from ragr1.services.retriever import metrics
from ragr1.services.retriever.router import Router

# Search-R1's retrieval server answers 3 passages per query unless asked otherwise.
DEFAULT_TOPK = 3
STATUS = {InvalidArgument: 422, Unavailable: 503, DeadlineExceeded: 504}
ROUTER_KEY = web.AppKey("router", Router)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


async def retrieve(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    started = time.perf_counter()
    try:
        body: Any = json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object with 'queries'")
    queries = body.get("queries")
    if not isinstance(queries, list):
        return _error(422, "queries must be a list of strings")
    try:
        result = await router.search(queries, body.get("topk", DEFAULT_TOPK))
    except ServiceError as exc:
        return _error(next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 500), str(exc))
    with_scores = bool(body.get("return_scores", False))
    answer: dict[str, Any] = {
        "result": [
            [
                {"document": {"id": h.id, "contents": h.contents}, "score": h.score}
                if with_scores
                else {"id": h.id, "contents": h.contents}
                for h in hits
            ]
            for hits in result.results
        ]
    }
    if result.partial:
        answer.update(partial=True, missing_shards=list(result.missing_shards))
    metrics.SEARCH_SECONDS.labels("http").observe(time.perf_counter() - started)
    return web.json_response(answer)


def create_app(router: Router) -> web.Application:
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[ROUTER_KEY] = router
    app.router.add_post("/retrieve", retrieve)
    return app


async def start_http(router: Router, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Starts the endpoint on the running event loop; returns the runner (to clean up) and the port."""
    runner = web.AppRunner(create_app(router), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])
