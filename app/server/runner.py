"""Running the app under uvicorn on a socket bound here (so a taken port is a one-line
error, and port 0 gives a free one): blocking for `prism serve`, or on a thread for
tests and benchmarks.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
import threading
import time

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


def server(app: ASGIApp) -> uvicorn.Server:
    """uvicorn with its fast parts (httptools, uvloop where installed), quiet: no access
    log, warnings only."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    config = uvicorn.Config(app, http="httptools", loop=loop, lifespan="off",
                            log_level="warning", access_log=False, timeout_keep_alive=30)
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
