"""Model metadata, readiness and configuration: `GET /v2/models/{m}[/versions/{v}]`,
`.../ready` and `.../config` (Triton's model configuration, as JSON)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.catalog import Served
from app.server.errors import error_response
from app.server.routes.body import json_response
from app.server.state import ServerState
from runtime.errors import NetworkNotFoundError, first_line

MODEL = "/v2/models/{model}"
VERSION = "/v2/models/{model}/versions/{version}"


def routes(state: ServerState) -> list[BaseRoute]:
    def served(request: Request) -> Served:
        params = request.path_params
        return state.catalog.get(params["model"], params.get("version"))

    async def metadata(request: Request) -> Response:
        model = served(request)
        return json_response(model.metadata(state.catalog.versions(model.name)))

    async def config(request: Request) -> Response:
        return json_response(served(request).config())

    async def ready(request: Request) -> Response:
        try:
            served(request)
        except NetworkNotFoundError as exc:  # health answers false with a 4xx, as Triton
            return error_response(400, f"model not ready: {first_line(exc)}")
        return Response()

    return [Route(MODEL, metadata), Route(VERSION, metadata),
            Route(f"{MODEL}/ready", ready), Route(f"{VERSION}/ready", ready),
            Route(f"{MODEL}/config", config), Route(f"{VERSION}/config", config)]
