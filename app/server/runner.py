"""Running the app under uvicorn on a socket bound here (so a taken port is a one-line
error, and port 0 gives a free one): blocking for `prism serve`, on a thread, or
`prism serve` as a child process (the last two for tests and benchmarks).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

import uvicorn
from starlette.types import ASGIApp

from runtime.errors import PrismError

START_WAIT = 10.0  # seconds a server thread may take to start or to stop


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, insecure: bool) -> None:
    """Any address but loopback needs a token, or the user's explicit --insecure."""
    if not loopback(host) and not token and not insecure:
        raise PrismError(f"--host {host} exposes the server beyond this machine: give "
                         f"--token T (clients send 'Authorization: Bearer T'), or --insecure")


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until uvicorn takes them
    except OSError as exc:
        raise PrismError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


GRACEFUL_SECONDS = 2  # a shutdown waits this long for open responses (event streams)


def server(app: ASGIApp) -> uvicorn.Server:
    """uvicorn with its fast parts (httptools, uvloop where installed), quiet: no access
    log, warnings only; and no X-Forwarded-* rewriting (nothing here reads the client's
    address, and it costs every request)."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    config = uvicorn.Config(app, http="httptools", loop=loop, lifespan="off",
                            log_level="warning", access_log=False, timeout_keep_alive=30,
                            timeout_graceful_shutdown=GRACEFUL_SECONDS, proxy_headers=False)
    return uvicorn.Server(config)


class ServerThread:
    """The app served on `sock` from a thread: a context manager; start and stop bounded."""

    def __init__(self, app: ASGIApp, sock: socket.socket):
        self.sock = sock
        self.url = url(sock)
        self.server = server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="prism-server", daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + START_WAIT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise PrismError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(START_WAIT)
        self.sock.close()


class ServeProcess:
    """`prism serve ARGS --port 0` in a child process (tests, benchmarks): a context manager
    that gives its URL once it listens, and stops it with Ctrl-C, or kills it if it does
    not stop within START_WAIT."""

    def __init__(self, args: Sequence[str], start_wait: float = 120.0, *,
                 command: Sequence[str] | None = None):
        command = command or [sys.executable, "-m", "app.cli", "serve", *args, "--port", "0"]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "200"})
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + start_wait
        found = None
        while found is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise PrismError(f"{' '.join(command)} did not start: "
                                 f"{self.proc.stderr.read().strip()[-300:]}")  # type: ignore[union-attr]
            found = re.search(r"http://[\w.:\[\]]+:\d+", line)
        self.url = found.group()

    @classmethod
    def python(cls, argv: Sequence[str]) -> ServeProcess:
        """Any Python program that prints its URL once it listens."""
        return cls((), command=[sys.executable, *argv])

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(START_WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(START_WAIT)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)  # closed: the process ended
