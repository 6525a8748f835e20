"""Model metadata, readiness, configuration and statistics: `GET
/v2/models/{m}[/versions/{v}]`, `.../ready`, `.../config` (Triton's model configuration,
as JSON) and `.../stats` (Triton's statistics extension; `GET /v2/models/stats`: every
model served)."""

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

    async def stats(request: Request) -> Response:
        params = request.path_params
        if "model" not in params:
            chosen = state.catalog.served()
        elif "version" in params:
            chosen = [served(request)]
        else:
            state.catalog.get(params["model"])  # 404 for a model not served
            chosen = [s for s in state.catalog.served() if s.name == params["model"]]
        return json_response({"model_stats": [
            state.metrics.model_stats(s.name, s.version)
            for s in sorted(chosen, key=lambda s: (s.name, s.version.zfill(20)))]})

    return [Route("/v2/models/stats", stats), Route(f"{MODEL}/stats", stats),
            Route(f"{VERSION}/stats", stats), Route(MODEL, metadata), Route(VERSION, metadata),
            Route(f"{MODEL}/ready", ready), Route(f"{VERSION}/ready", ready),
            Route(f"{MODEL}/config", config), Route(f"{VERSION}/config", config)]
