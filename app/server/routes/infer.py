"""`POST /v2/models/{m}[/versions/{v}]/infer`: JSON or binary tensors in, the same out.

Small requests are decoded, checked and encoded right on the event loop (a thread
hand-off costs more); large ones on a worker thread, so they never stall the others.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.server.calls import OFFLOAD_BYTES, maybe_offload, run
from app.server.routes.models import MODEL, VERSION
from app.server.state import ServerState
from app.server.tensors import TensorError, encode_response, parse_infer
from runtime.errors import InvalidInputError, QueueFullError

HEADER_LENGTH = "inference-header-content-length"


def routes(state: ServerState) -> list[BaseRoute]:
    catalog, host, metrics = state.catalog, state.host, state.metrics

    async def infer(request: Request) -> Response:
        params = request.path_params
        served = catalog.get(params["model"], params.get("version"))
        body = await request.body()
        try:
            parsed = await maybe_offload(len(body), parse_infer, body,
                                         request.headers.get(HEADER_LENGTH), served.inputs)
            outputs = await run(host, served.network, parsed.feeds, parsed.priority,
                                parsed.timeout, large=len(body) > OFFLOAD_BYTES)
        except (TensorError, InvalidInputError, QueueFullError) as exc:
            reason = "REJECTED" if isinstance(exc, QueueFullError) else "OTHER"
            metrics.rejected(served.name, served.version, reason)
            raise
        size = sum(a.nbytes for a in outputs.values())
        content, header = await maybe_offload(size, encode_response, served.name,
                                              served.version, parsed, outputs)
        if header is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(header)})

    return [Route(f"{MODEL}/infer", infer, methods=["POST"]),
            Route(f"{VERSION}/infer", infer, methods=["POST"])]
