"""Errors as the protocol has them: `{"error": "one line"}` with Triton's status.

400 a malformed request or tensor, or a model that will not load; 401 no or a wrong
token; 404 an unknown model or route; 405 a wrong method; 413 a body over the limit;
503 the queue is full (Triton's UNAVAILABLE), the host closing, or a model still busy;
504 a request's timeout passed; 500 a run failed on a device, or a fault of the server's
own (logged with its traceback; the server keeps serving).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.server.tensors import TensorError
from runtime.errors import (
    ExecutionError,
    HostClosedError,
    NetworkBusyError,
    NetworkNotFoundError,
    PrismError,
    QueueFullError,
    RequestTimeoutError,
    first_line,
)

log = logging.getLogger("prism.server")
STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (NetworkNotFoundError, 404), (QueueFullError, 503), (HostClosedError, 503),
    (NetworkBusyError, 503), (RequestTimeoutError, 504), (ExecutionError, 500),
    (PrismError, 400), (TensorError, 400))


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None
                   ) -> Response:
    return Response(orjson.dumps({"error": message}), status, headers,
                    media_type="application/json")


def in_public(exc: BaseException, name: str) -> BaseException:
    """`exc`, its message naming model `name` where it named a network the host serves it
    by (`mlp#3`, a reload's): the host's names stay inside the server."""
    if exc.args and isinstance(exc.args[0], str) and f"{name}#" in exc.args[0]:
        exc.args = (re.sub(re.escape(name) + r"#\d+", lambda _: name, exc.args[0]),
                    *exc.args[1:])
    return exc


def status_of(exc: BaseException) -> int:
    return next((status for kind, status in STATUS if isinstance(exc, kind)), 500)


async def _expected(request: Request, exc: Exception) -> Response:
    return error_response(status_of(exc), first_line(exc))


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {first_line(exc)}")


HANDLERS = {PrismError: _expected, TensorError: _expected, HTTPException: _http,
            Exception: _unexpected}


async def respond(exc: Exception, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer `exc` as HANDLERS do behind Starlette's exception middleware, for an app
    that is not behind it (the hot route)."""
    handler = next(HANDLERS[kind] for kind in type(exc).__mro__ if kind in HANDLERS)
    response = await handler(Request(scope, receive), exc)
    await response(scope, receive, send)
