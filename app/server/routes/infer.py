"""`POST /v2/models/{m}[/versions/{v}]/infer`: JSON or binary tensors in, the same out.

The one hot route is a plain ASGI app (no Request or Response objects: ~30 us a request
on the test machine), and `HotRoute` hands it its requests straight from uvicorn, behind
the guard, past Starlette's middleware and router (~40 us more). Small requests are
decoded, checked and encoded right on the event loop (a thread hand-off costs more);
large ones on a worker thread, so they never stall the others.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import replace

import numpy as np
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.calls import OFFLOAD_BYTES, decode_size, maybe_offload, run
from app.server.catalog import Served
from app.server.errors import in_public, respond
from app.server.guard import Guard, waits_to_send
from app.server.routes.models import MODEL, VERSION
from app.server.state import ServerState
from app.server.tensors import (
    InferRequest,
    TensorError,
    check_outputs,
    encode_response,
    on_the_wire,
    parse_infer,
)
from runtime.errors import InvalidInputError, NetworkNotFoundError, QueueFullError

HEADER_LENGTH = b"inference-header-content-length"
_JSON = [(b"content-type", b"application/json")]
_BINARY = [(b"content-type", b"application/octet-stream")]
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # zlib's wbits for each
RELOADS_FOLLOWED = 3  # a request follows its model through this many reloads at once


class Infer:
    def __init__(self, state: ServerState):
        self.catalog, self.runs, self.metrics = state.catalog, state.runs, state.metrics
        self.max_body = state.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        version = params.get("version")
        # read first: an answer sent with the body unread closes the connection under a
        # client still sending it, which sees a reset, not the answer (an unknown model);
        # one that sends it only when asked is answered at once
        if waits_to_send(scope):
            self.catalog.get(params["model"], version)
        body = await _body(receive)
        served = self.catalog.get(params["model"], version)
        given = dict(scope["headers"])
        header = given[HEADER_LENGTH].decode("latin-1") if HEADER_LENGTH in given else None
        if (encoding := given.get(b"content-encoding")) is not None:
            body = await maybe_offload(len(body), _decoded, body, encoding.decode("latin-1"),
                                       self.max_body)
        size = decode_size(body, header is not None)
        large = size > OFFLOAD_BYTES
        try:
            parsed = await maybe_offload(size, parse_infer, body, header, served.inputs)
            check_outputs(served.name, parsed, [o.name for o in served.outputs])
            served.check_rows(parsed.feeds)
            if (feeds := served.to_model(parsed.feeds)) is not parsed.feeds:
                parsed = replace(parsed, feeds=feeds)
            try:
                outputs = await run(self.runs, served.network, parsed.feeds, parsed.priority,
                                    parsed.timeout, large=large,
                                    rows=served.counted_rows(parsed.feeds))
            except NetworkNotFoundError:
                served, outputs = await self._after_reload(served, version, parsed, large)
            outputs = on_the_wire(served.to_client(outputs))
            if parsed.classes:
                outputs = served.classified(outputs, parsed.classes)
        except Exception as exc:
            if isinstance(exc, TensorError | InvalidInputError | QueueFullError):
                reason = "REJECTED" if isinstance(exc, QueueFullError) else "OTHER"
                self.metrics.rejected(served.name, served.version, reason)
            raise in_public(exc, served.name) from None
        size = sum(a.nbytes for a in outputs.values())
        content, json_length = await maybe_offload(size, encode_response, served.name,
                                                   served.version, parsed, outputs)
        headers = _JSON if json_length is None else [
            *_BINARY, (HEADER_LENGTH, str(json_length).encode())]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*headers, (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})

    async def _after_reload(self, served: Served, version: str | None, parsed: InferRequest,
                            large: bool) -> tuple[Served, dict[str, np.ndarray]]:
        """The outputs of a request whose network was gone when it reached the host: from
        the network that serves its model now, if a reload replaced it (and again, up to
        RELOADS_FOLLOWED times, should that one go too)."""
        for _ in range(RELOADS_FOLLOWED):
            now = self.catalog.get(served.name, version)  # raises if it is gone
            if now is served:
                break
            served = now
            try:
                return served, await run(self.runs, served.network, parsed.feeds,
                                         parsed.priority, parsed.timeout, large=large,
                                         rows=served.counted_rows(parsed.feeds))
            except NetworkNotFoundError:
                continue
        raise NetworkNotFoundError(f"model {served.name!r} is being unloaded or reloaded; "
                                   f"retry")


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPException(400, "the client went away before sending its whole request")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as it was before `Content-Encoding` compressed it (tritonclient's
    request_compression_algorithm), refused past `limit` bytes decompressed."""
    encoding = encoding.strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ENCODINGS:
        raise HTTPException(400, f"Content-Encoding {encoding!r} is not supported; use "
                                 f"{' or '.join(ENCODINGS)}")
    inflater = zlib.decompressobj(ENCODINGS[encoding])
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HTTPException(400, f"the {encoding} body does not decompress: {exc}") from None
    if len(plain) > limit:
        raise HTTPException(413, f"request body is over the {limit}-byte limit decompressed")
    return plain


def infer_params(path: str) -> dict[str, str] | None:
    """The path parameters of an infer path (as the routes below match it), else None."""
    parts = path.split("/")  # "", "v2", "models", MODEL, ["versions", VERSION,] "infer"
    if parts[1:3] != ["v2", "models"] or parts[-1] != "infer" or not all(parts[3:-1]):
        return None
    if len(parts) == 5:
        return {"model": parts[3]}
    if len(parts) == 7 and parts[4] == "versions":
        return {"model": parts[3], "version": parts[5]}
    return None


class HotRoute:
    """`POST` to an infer path goes to `Infer` behind its own guard and the protocol's
    error answers; any other request to `app` (which routes infer paths too: their 405s)."""

    def __init__(self, state: ServerState, app: ASGIApp):
        self.app, self.infer, self.state = app, Infer(state), state
        settings = state.settings
        self.guarded = Guard(self._answered, settings.token, settings.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] == "http" and scope["method"] == "POST":
                params = infer_params(scope["path"])
                if params is not None:
                    scope["path_params"] = params
                    return await self.guarded(scope, receive, send)
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.state.closing:
                raise
            # the server stopped and answered this request itself (runner.PrismServer)

    async def _answered(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.infer(scope, receive, send)
        except Exception as exc:  # raised before its answer started: Infer sends last
            await respond(exc, scope, receive, send)


def routes(state: ServerState) -> list[BaseRoute]:
    infer = Infer(state)
    return [Route(f"{MODEL}/infer", infer, methods=["POST"]),
            Route(f"{VERSION}/infer", infer, methods=["POST"])]
