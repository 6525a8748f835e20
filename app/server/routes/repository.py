"""The model repository extension: `POST /v2/repository/index`,
`/v2/repository/models/{m}/load` (parameters: see app.server.load_options) and `.../unload`.
Loads run on a worker thread: the server keeps answering while a model loads."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.routes.body import json_body, json_response, parameters
from app.server.state import ServerState
from app.server.tensors import TensorError


def routes(state: ServerState) -> list[BaseRoute]:
    catalog = state.catalog

    async def index(request: Request) -> Response:
        ready = (await json_body(request, "index")).get("ready", False)
        if not isinstance(ready, bool):
            raise TensorError("index: 'ready' must be a boolean")
        return json_response(catalog.index(ready))

    async def load(request: Request) -> Response:
        params = parameters(await json_body(request, "load"), "load")
        await run_in_threadpool(catalog.load, request.path_params["model"], params)
        return Response()

    async def unload(request: Request) -> Response:
        parameters(await json_body(request, "unload"), "unload")  # unload_dependents: none
        await run_in_threadpool(catalog.unload, request.path_params["model"])
        return Response()

    return [Route("/v2/repository/index", index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", unload, methods=["POST"])]
