"""Health and server metadata: `GET /v2/health/live`, `/v2/health/ready`, `/v2`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.errors import error_response
from app.server.routes.body import json_response
from app.server.state import ServerState
from runtime.versions import DISTRIBUTION, installed

EXTENSIONS = ["binary_tensor_data", "classification", "model_repository", "parameters",
              "statistics"]


def routes(state: ServerState) -> list[BaseRoute]:
    async def live(request: Request) -> Response:
        return Response()

    async def ready(request: Request) -> Response:
        if state.ready:
            return Response()
        return error_response(400, "server is not ready: models are still loading, or it "
                                   "is shutting down")

    async def metadata(request: Request) -> Response:
        return json_response({"name": "prism", "version": installed(DISTRIBUTION),
                              "extensions": EXTENSIONS})

    return [Route("/v2/health/live", live), Route("/v2/health/ready", ready),
            Route("/v2", metadata)]
