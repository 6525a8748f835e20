"""`POST /v2/models/{m}[/versions/{v}]/infer`: JSON or binary tensors in, the same out.

The one hot route is a plain ASGI app (no Request or Response objects: ~30 us a request
on the test machine). Small requests are decoded, checked and encoded right on the event
loop (a thread hand-off costs more); large ones on a worker thread, so they never stall
the others.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from app.server.calls import OFFLOAD_BYTES, maybe_offload, run
from app.server.routes.models import MODEL, VERSION
from app.server.state import ServerState
from app.server.tensors import TensorError, encode_response, parse_infer
from runtime.errors import InvalidInputError, QueueFullError

HEADER_LENGTH = b"inference-header-content-length"
_JSON = [(b"content-type", b"application/json")]
_BINARY = [(b"content-type", b"application/octet-stream")]


class Infer:
    def __init__(self, state: ServerState):
        self.catalog, self.host, self.metrics = state.catalog, state.host, state.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        served = self.catalog.get(params["model"], params.get("version"))
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == HEADER_LENGTH),
                      None)
        body = await _body(receive)
        try:
            parsed = await maybe_offload(len(body), parse_infer, body, header, served.inputs)
            outputs = await run(self.host, served.network, parsed.feeds, parsed.priority,
                                parsed.timeout, large=len(body) > OFFLOAD_BYTES)
        except (TensorError, InvalidInputError, QueueFullError) as exc:
            reason = "REJECTED" if isinstance(exc, QueueFullError) else "OTHER"
            self.metrics.rejected(served.name, served.version, reason)
            raise
        size = sum(a.nbytes for a in outputs.values())
        content, json_length = await maybe_offload(size, encode_response, served.name,
                                                   served.version, parsed, outputs)
        headers = _JSON if json_length is None else [
            *_BINARY, (HEADER_LENGTH, str(json_length).encode())]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*headers, (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPException(400, "the client went away before sending its whole request")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def routes(state: ServerState) -> list[BaseRoute]:
    infer = Infer(state)
    return [Route(f"{MODEL}/infer", infer, methods=["POST"]),
            Route(f"{VERSION}/infer", infer, methods=["POST"])]
