"""Running the app under uvicorn on a socket bound here (so a taken port is a one-line
error, and port 0 gives a free one): blocking for `prism serve`, on a thread, or
`prism serve` as a child process (the last two for tests and benchmarks). `PrismServer`
is uvicorn's server with Prism's connections (`protocol.py`: JSON parser errors, header
and body timeouts, a connection cap) and its stop: a drain on SIGTERM or SIGINT alike.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import IO

import uvicorn
from starlette.types import ASGIApp

from app.server.protocol import Connection, Limits, protocol, sweep
from runtime.errors import PrismError

START_WAIT = 10.0  # seconds a server thread may take to start or to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; docker, Kubernetes, systemd


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


SWEEP_TICKS = 2  # the server looks for overdue requests every 2 ticks of 0.1 s
FLUSH_SECONDS = 2.0  # after the grace period: for the last answers to leave


class PrismServer(uvicorn.Server):
    """uvicorn's server with Prism's stop: SIGTERM and SIGINT alike stop it accepting,
    requests in flight get `limits.grace_seconds` to finish, what is left is answered 503,
    and it returns (a second signal cuts the wait short). It never re-raises the signal,
    so the command exits as it chooses (0), whoever installed a handler before (Ray's
    sys.exit(15) on SIGTERM). Its tick also times out slow clients (`protocol.sweep`)."""

    def __init__(self, config: uvicorn.Config, limits: Limits,
                 on_stop: Callable[[PrismServer], None] | None = None):
        super().__init__(config)
        self.limits, self.on_stop = limits, on_stop
        self.stopped_by: str | None = None  # the signal's name, when one stopped it

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True  # a second signal: stop waiting for requests
        else:
            self.stopped_by, self.should_exit = signal.Signals(sig).name, True

    async def on_tick(self, counter: int) -> bool:
        if counter % SWEEP_TICKS == 0 and self.server_state.connections:
            sweep(self.server_state.connections, time.monotonic())
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_stop is not None:
            self.on_stop(self)
        for listener in self.servers:  # no new connections
            listener.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):  # idle ones close, busy ones after
            connection.shutdown()                   # their answer
        deadline = time.monotonic() + self.limits.grace_seconds
        while state.tasks and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(state.connections):
            if isinstance(connection, Connection) and connection.answering:
                connection.refuse(503, f"the server stopped before this request finished "
                                       f"(it waited {self.limits.grace_seconds:g} s)")
        for task in list(state.tasks):
            task.cancel()
        deadline = time.monotonic() + FLUSH_SECONDS
        while (state.tasks or state.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def server(app: ASGIApp, limits: Limits | None = None,
           on_stop: Callable[[PrismServer], None] | None = None) -> PrismServer:
    """uvicorn with its fast parts (httptools, uvloop where installed) in Prism's
    connection (`protocol.Connection`), quiet: no access log, warnings only; and no
    X-Forwarded-* rewriting (nothing here reads the client's address, and it costs every
    request)."""
    limits = limits or Limits()
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    config = uvicorn.Config(app, http=protocol(limits), loop=loop, lifespan="off",
                            log_level="warning", access_log=False,
                            timeout_keep_alive=limits.keep_alive_seconds,
                            proxy_headers=False)
    return PrismServer(config, limits, on_stop)


class ServerThread:
    """The app served on `sock` from a thread: a context manager; start and stop bounded."""

    def __init__(self, app: ASGIApp, sock: socket.socket, limits: Limits | None = None):
        self.sock = sock
        self.url = url(sock)
        self.server = server(app, limits or Limits(grace_seconds=START_WAIT / 2))
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
    that gives its URL once it listens (`printed`: what it printed until then), and stops
    it with Ctrl-C, or kills it if it does not stop within START_WAIT. `columns`: the
    terminal width it is told (None: none, as under a process manager)."""

    def __init__(self, args: Sequence[str], start_wait: float = 120.0, *,
                 command: Sequence[str] | None = None, columns: int | None = 200):
        command = command or [sys.executable, "-m", "app.cli", "serve", *args, "--port", "0"]
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env if columns is None else {**env, "COLUMNS": str(columns)})
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + start_wait
        found, self.printed = None, []
        while found is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise PrismError(f"{' '.join(command)} did not start: "
                                 f"{self.proc.stderr.read().strip()[-300:]}")  # type: ignore[union-attr]
            self.printed.append(line)
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
