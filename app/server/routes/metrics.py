"""`GET /metrics`: Prometheus text, rendered on a worker thread."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.prometheus import CONTENT_TYPE
from app.server.state import ServerState


def routes(state: ServerState) -> list[BaseRoute]:
    async def metrics(request: Request) -> Response:
        return Response(await run_in_threadpool(state.metrics.render), media_type=CONTENT_TYPE)

    return [Route("/metrics", metrics)]
