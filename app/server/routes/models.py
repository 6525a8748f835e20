"""Model metadata and readiness: `GET /v2/models/{m}[/versions/{v}]` and `.../ready`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.errors import error_response
from app.server.routes.body import json_response
from app.server.state import ServerState
from runtime.errors import NetworkNotFoundError, first_line

MODEL = "/v2/models/{model}"
VERSION = "/v2/models/{model}/versions/{version}"


def routes(state: ServerState) -> list[BaseRoute]:
    async def metadata(request: Request) -> Response:
        params = request.path_params
        return json_response(state.catalog.get(params["model"], params.get("version"))
                             .metadata())

    async def ready(request: Request) -> Response:
        params = request.path_params
        try:
            state.catalog.get(params["model"], params.get("version"))
        except NetworkNotFoundError as exc:  # health answers false with a 4xx, as Triton
            return error_response(400, f"model not ready: {first_line(exc)}")
        return Response()

    return [Route(MODEL, metadata), Route(VERSION, metadata),
            Route(f"{MODEL}/ready", ready), Route(f"{VERSION}/ready", ready)]
