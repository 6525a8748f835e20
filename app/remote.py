"""A running `prism serve` as a RuntimeSource: the dashboards attach to it (`--connect URL`)
and show what they show for an embedded runtime, through the same view model.

Events arrive over the server's event stream (`app/server/routes/watch.py`) on a reader
thread, which resumes after the last event number it saw whenever a response ends or the
link drops; `drain` hands over what arrived. The plan, its outline and the bundle come from
the networks query (asked again when a `network.loaded` event says the plan changed), the
device counts from the devices query, which also gives the server's clock. Nothing can be
changed from here: a server's load is its clients'.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.dashboard.source import (
    BundleInfo,
    LoadState,
    PartitionSteps,
    ReadOnly,
    Status,
)
from runtime.bundle.plan_io import plan_from_dict
from runtime.devices.device import DeviceStats
from runtime.errors import PrismError, first_line
from runtime.observe.events import Event
from runtime.partition import Plan, Step
from runtime.partition.dot import Outline

PREFIX = "/v2/prism"
TIMEOUT = 10.0  # seconds any one query or read may take
RETRY_SECONDS = 0.5  # between attempts to reopen a dropped event stream
KEEP = 100_000  # events held for the next drain; beyond, the oldest go (and are counted)


def outline_of(data: dict) -> Outline:
    return Outline(data["name"], dict(data["ops"]),
                   tuple((src, dst, tuple(tensors)) for src, dst, tensors in data["edges"]),
                   dict(data["sizes"]))


class RemoteSource(ReadOnly):
    def __init__(self, url: str, token: str | None = None):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PrismError(f"--connect takes a server's URL (http://HOST:PORT), got {url!r}")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self._parts = parts
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()
        self._lost = 0
        self._after = 0
        self._closed = threading.Event()
        self._conn: http.client.HTTPConnection | None = None  # the stream's, while open
        self._refresh()
        self._offset = 0.0
        self.device_stats()  # the server's clock, and a first look at its devices
        self._reader = threading.Thread(target=self._read, name="prism-remote", daemon=True)
        self._reader.start()

    # -- queries -------------------------------------------------------------------------

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                said = json.load(exc).get("error", "")
            except (ValueError, AttributeError):
                said = ""
            raise PrismError(f"{self.url}{path}: HTTP {exc.code} {said or exc.reason}") from None
        except (OSError, ValueError) as exc:
            raise PrismError(f"cannot reach a Prism server at {self.url}: "
                             f"{first_line(exc)}") from None

    def _refresh(self) -> None:
        nets = self._get(f"{PREFIX}/networks")
        if not nets:
            raise PrismError(f"{self.url} serves no network yet; load one first")
        net = nets[0]
        self._names = [n["network"] for n in nets]
        self._network, self._model = net["network"], net["model"]
        self._mode, self._devices = net["mode"], net["devices"]
        self._plan = plan_from_dict(net["plan"])
        self._outline = outline_of(net["outline"])
        origin = net.get("bundle")
        self._bundle = None if origin is None else BundleInfo.of(
            origin["path"], origin["manifest"], origin["placed"])

    def device_stats(self) -> dict[str, DeviceStats]:
        asked = time.monotonic()
        answer = self._get(f"{PREFIX}/devices")
        self._offset = answer["now"] - (asked + time.monotonic()) / 2
        return {name: DeviceStats(**d) for name, d in answer["devices"].items()}

    def partition_steps(self, mode: str) -> PartitionSteps:
        data = self._get(f"{PREFIX}/networks/{self._network}/steps?mode={mode}")
        steps = tuple(Step(**{**s, "nodes": tuple(s["nodes"])}) for s in data["steps"])
        return PartitionSteps(Path(self._model).stem, data["mode"], data["devices"], steps,
                              plan_from_dict(data["plan"]), outline_of(data["outline"]))

    # -- the event stream ----------------------------------------------------------------

    def _read(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                self._stream()  # ends with its response, or the link: resume after it
            self._closed.wait(RETRY_SECONDS)

    def _stream(self) -> None:
        """One response of the stream: events after the last one seen, until it ends."""
        kind = http.client.HTTPSConnection if self._parts.scheme == "https" else \
            http.client.HTTPConnection
        conn = kind(self._parts.hostname or "", self._parts.port, timeout=TIMEOUT)
        self._conn = conn
        try:
            conn.request("GET", f"{PREFIX}/events?after={self._after}", headers=self._headers)
            response = conn.getresponse()
            if response.status != 200:
                return
            number, data = None, None
            while not self._closed.is_set():
                line = response.readline()
                if not line:
                    return
                text = line.decode().rstrip("\n")
                if text.startswith("id: "):
                    number = int(text[4:])
                elif text.startswith("data: "):
                    data = text[6:]
                elif not text and data is not None:
                    self._take(Event.from_json(data), number)
                    number, data = None, None
        finally:
            conn.close()

    def _take(self, event: Event, number: int | None) -> None:
        with self._lock:
            if len(self._events) == KEEP:
                self._events.popleft()
                self._lost += 1
            self._events.append(event)
            if number is not None:
                self._after = max(self._after, number)

    def drain(self) -> list[Event]:
        with self._lock:
            out = list(self._events)
            self._events.clear()
            lost, self._lost = self._lost, 0
        if lost:
            out.insert(0, Event("bus.lost", out[0].ts if out else self.now(), {"lost": lost}))
        if any(e.kind == "network.loaded" for e in out):
            self._refresh()
        return out

    # -- what runs -----------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() + self._offset

    def state(self) -> Status:
        return Status(self._model, self._network, self._mode, self._devices,
                      LoadState(None, paused=False), bundle=self._bundle is not None)

    def plan(self) -> Plan:
        return self._plan

    def outline(self) -> Outline:
        return self._outline

    def bundle(self) -> BundleInfo | None:
        return self._bundle

    def networks(self) -> list[str]:
        return list(self._names)

    # -- controls: a server's load and plan are its own ------------------------------------

    def _refuse(self, what: str) -> PrismError:
        return PrismError(f"cannot {what} from a dashboard attached to {self.url}: its load "
                          f"comes from its clients, its models from its repository")

    def close(self) -> None:
        """Stop reading: the open stream is cut, and the reader ends within a bound."""
        self._closed.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(TIMEOUT)
