"""What every request passes before any route: the bearer token and the body limit.

A pure ASGI middleware (no per-request objects). The token is compared in constant time
(`hmac.compare_digest`); the scheme `Bearer` in any case (RFC 7235). Health probes
(`/v2/health/live`, `/v2/health/ready`) pass without it, as Triton and KServe leave them,
unless the server is told to ask there too. A body is refused on its declared
Content-Length, or, sent in chunks, as soon as it grows past the limit. WebSocket
connections (the event stream) are held to the token too.

An answer sent with the request's body unread closes the connection under a client still
sending it, which sees a reset, not the answer: a request refused for its token, and any
answered behind Starlette (`ReadBeforeAnswer`), is read to its end first, up to the limit
(one over it, up to LINGER times the limit), unless the client waits to be told to send
it (`waits_to_send`).
"""

from __future__ import annotations

import hmac

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEALTH_PATHS = frozenset(("/v2/health/live", "/v2/health/ready"))
# A body declared over the limit is still read (and dropped), up to this many times the
# limit, so that its client gets the 413 rather than a reset; past that, the connection
# closes. (One sent in chunks is answered as it passes the limit; uvicorn reads the rest.)
LINGER = 16


def bearer_token(authorization: bytes) -> bytes | None:
    """The credentials of an `Authorization: Bearer T` header (scheme in any case), or None."""
    scheme, _, credentials = authorization.strip().partition(b" ")
    return credentials.strip() if scheme.lower() == b"bearer" else None


class Guard:
    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int,
                 open_paths: frozenset[str] = frozenset()):
        self.app = app
        self.expected = token.encode() if token else None
        self.max_body = max_body_bytes
        self.open_paths = open_paths  # paths that need no token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        authorization, length = b"", b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
            elif key == b"content-length":
                length = value
        if self.expected is not None and scope["path"] not in self.open_paths:
            given = bearer_token(authorization)
            if given is None or not hmac.compare_digest(given, self.expected):
                if kind == "websocket":
                    return await send({"type": "websocket.close", "code": 1008})
                if not waits_to_send(scope):
                    await _drained(receive, self.max_body)
                return await _refuse(send, 401, "missing or wrong bearer token (send "
                                                "Authorization: Bearer TOKEN)",
                                     ((b"www-authenticate", b"Bearer"),))
        if kind == "websocket":
            return await self.app(scope, receive, send)
        if length:
            if not length.isdigit() or int(length) > self.max_body:
                if length.isdigit() and int(length) <= LINGER * self.max_body and \
                        not waits_to_send(scope):
                    await _drained(receive, int(length))
                return await _refuse(send, 413, f"request body of {length.decode('latin-1')} "
                                                f"bytes is over the {self.max_body}-byte limit")
            return await self.app(scope, receive, send)
        await self.app(scope, self._counted(receive), send)

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise HTTPException(413, f"request body is over the {self.max_body}-byte limit")
            return message

        return counted


class ReadBeforeAnswer:
    """Reads what is left of a request's body, up to the limit, before its answer starts
    (`_drained`), for the routes behind Starlette: a path no route has, a method its
    route does not take, a refusal before the route reads. The infer route reads its
    body first and does not pass here."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app, self.max_body = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        ended = waits_to_send(scope)  # until the route reads, nothing is on its way

        async def tracked() -> Message:
            nonlocal ended
            message = await receive()
            ended = message["type"] == "http.disconnect" or not message.get("more_body")
            return message

        async def answer(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start" and not ended:
                ended = True
                await _drained(receive, self.max_body)
            await send(message)

        await self.app(scope, tracked, answer)


def waits_to_send(scope: Scope) -> bool:
    """Does the client send its body only once told to go on (`Expect: 100-continue`,
    as curl does past 1 MB)? uvicorn tells it when the body is first read, so an answer
    before that needs no body read: the client never sends it."""
    return any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])


async def _drained(receive: Receive, limit: int) -> None:
    """Read a request's body, up to `limit` bytes, and drop it: an answer sent with the
    body unread closes the connection under a client still sending it, which then sees a
    reset, not the answer. (The protocol's body timeout bounds how long it takes.)"""
    seen = 0
    while seen <= limit:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


async def _refuse(send: Send, status: int, message: str,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = orjson.dumps({"error": message})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
