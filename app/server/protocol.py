"""Each HTTP/1.1 connection, as uvicorn's httptools protocol serves it, with what a server
that faces clients it does not know needs around it (uvicorn's `http` setting takes the
class; `protocol(limits)` makes it):

- every answer the HTTP parser gives itself (a malformed request line, bad chunk framing,
  `Content-Length: 1e30`) is `{"error": ...}` JSON, as the routes' errors are, naming
  what the parser found;
- a header timeout (the whole header must arrive within it, from the connection's start
  or the request's first byte) and a body timeout (the longest pause while a body
  arrives), as nginx's client_header_timeout and client_body_timeout: a request that
  overstays is answered 408 and its connection closed;
- a connection cap: a request on a connection over it is answered 503, and the
  connection closed; a health probe (`/v2/health/live`, `/ready`) is answered still, so
  an orchestrator does not restart a server for being busy.

A request pays two clock reads for the timeouts, no timer: the server's tick looks over
the connections (`sweep`, from `runner.PrismServer`). `Connection.refuse` also answers
what is left unanswered when a shutdown's grace period ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httptools
import orjson
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.server.errors import error_response
from app.server.guard import HEALTH_PATHS

_IDLE, _HEADERS, _BODY = 0, 1, 2  # what a connection waits for from its client


@dataclass(frozen=True)
class Limits:
    """What one server allows its connections, and how long it drains when told to stop."""

    header_timeout: float = 10.0  # seconds for a request's whole header
    body_timeout: float = 30.0  # seconds the body may pause
    max_connections: int = 1000
    grace_seconds: float = 30.0  # a stop waits this long for requests in flight (Triton's
    #                              --exit-timeout-secs), then answers the rest with 503
    keep_alive_seconds: int = 30  # an idle connection closes after this


def raw_error(status: int, message: str) -> bytes:
    """A whole HTTP response, `{"error": message}`, closing the connection."""
    body = orjson.dumps({"error": message})
    return b"".join((STATUS_LINE[status], b"content-type: application/json\r\n"
                     b"content-length: ", str(len(body)).encode(), b"\r\n"
                     b"connection: close\r\n\r\n", body))


class Connection(HttpToolsProtocol):
    limits = Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.phase, self.since = _HEADERS, time.monotonic()
        if len(self.connections) > self.limits.max_connections:
            self._app, self.app = self.app, self._over_cap  # its request is read, then refused

    async def _over_cap(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in HEALTH_PATHS:
            return await self._app(scope, receive, send)
        await error_response(503, f"the server has {self.limits.max_connections} connections "
                                  f"open, its limit; retry later",
                             {"connection": "close"})(scope, receive, send)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the parser's own refusal as JSON naming what it found."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            self.refuse(400, f"malformed HTTP request: {exc}")

    def send_400_response(self, msg: str) -> None:
        self.refuse(400, f"malformed HTTP request: {msg}")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.phase, self.since = _HEADERS, time.monotonic()

    def on_headers_complete(self) -> None:
        self.phase, self.since = _BODY, time.monotonic()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.since = time.monotonic()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.phase = _IDLE
        super().on_message_complete()

    def overdue(self, now: float) -> str | None:
        """Why this connection's client has taken too long, or None."""
        if self.phase == _HEADERS:
            limit, what = self.limits.header_timeout, "request headers"
        elif self.phase == _BODY and not self.flow.read_paused:
            limit, what = self.limits.body_timeout, "request body"
        else:  # idle (uvicorn's keep-alive timeout), or the app is slow to read: not theirs
            self.since = now
            return None
        if now - self.since <= limit:
            return None
        return f"the {what} did not arrive within {limit:g} s"

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` with `{"error": message}` unless an answer has begun, and close.
        The request's app sees a client gone: what it sends after is dropped."""
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is None or not cycle.response_started:
            self.transport.write(raw_error(status, message))
        if cycle is not None:
            cycle.response_started = cycle.response_complete = cycle.disconnected = True
            cycle.message_event.set()
        self.phase = _IDLE
        self.transport.close()

    @property
    def answering(self) -> bool:
        """A request has come whose answer is not yet complete."""
        return self.cycle is not None and not self.cycle.response_complete


def protocol(limits: Limits) -> type[Connection]:
    """The protocol class uvicorn is given, held to `limits`."""
    return type("Connection", (Connection,), {"limits": limits})


def sweep(connections: Iterable[object], now: float) -> None:
    """Refuse every request whose client has overstayed its timeout."""
    for connection in list(connections):
        if isinstance(connection, Connection) and (why := connection.overdue(now)):
            connection.refuse(408, why)
