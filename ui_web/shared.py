"""One LiveRuntime per server process, shared by every browser tab.

Streamlit runs each tab's script on its own thread, so every touch of the runtime (polls
included: they drain the event bus into one Metrics) goes through one lock. Polls are
memoised briefly, so several tabs refreshing each second cost one drain.
No Streamlit here: `cached.py` holds the instance with st.cache_resource.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.live import SAMPLES, LiveRuntime, LiveView, Stepper
from runtime.errors import PrismError
from runtime.graph import Graph

VIEW_MAX_AGE = 0.4  # seconds a poll is reused by other tabs


@dataclass(frozen=True)
class LoadSetting:
    """Open loop at `rate` requests/s, or closed loop with `clients` waiting clients."""

    rate: float | None = None
    clients: int | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.clients is None):
            raise PrismError("load: give either a rate or a number of clients")


@dataclass(frozen=True)
class Applied:
    """What an Apply did: `error` is None when every change took."""

    message: str
    error: str | None = None


def sample_models() -> dict[str, Path]:
    return {p.name: p for p in sorted(SAMPLES.glob("*.onnx"))}


def _safe_name(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).stem).strip("._") or "upload"
    return f"{stem[:40]}.onnx"


class SharedLive:
    def __init__(self, live: LiveRuntime):
        self.live = live
        self.lock = threading.RLock()
        self._view: LiveView | None = None
        self._graph: Graph | None = None
        self._view_at = -1.0
        self._uploads = Path(tempfile.mkdtemp(prefix="prism-web-"))
        self._upload_names: dict[str, str] = {}  # saved path -> the name the user gave
        self._closed = False

    # -- reading ----------------------------------------------------------------------

    def current(self, max_age: float = VIEW_MAX_AGE) -> tuple[LiveView, Graph | None]:
        """The present view and the graph its plan was made from, taken together (another
        tab may re-plan at any moment)."""
        with self.lock:
            now = time.monotonic()
            if self._view is None or now - self._view_at > max_age:
                self._view, self._graph = self.live.poll(), self.live.graph
                self._view_at = now
            return self._view, self._graph

    def view(self, max_age: float = VIEW_MAX_AGE) -> LiveView:
        return self.current(max_age)[0]

    def graph(self) -> Graph | None:
        return self.current()[1]

    @property
    def model(self) -> Path:
        return self.live.model

    @property
    def load(self) -> LoadSetting:
        with self.lock:
            load = self.live.load
            rate = load.rate if load is not None else self.live.rate
            clients = load.concurrency if load is not None else self.live.concurrency
            return LoadSetting(rate=rate) if rate is not None else LoadSetting(clients=clients)

    def stepper(self, mode: str) -> Stepper:
        with self.lock:
            return self.live.stepper(mode)

    # -- controls ---------------------------------------------------------------------

    def toggle_pause(self) -> None:
        with self.lock:
            self.live.toggle_pause()
            self._view = None

    def save_upload(self, name: str, data: bytes) -> Path:
        """Write uploaded bytes to a file the runtime can load (kept while it may be used)."""
        folder = Path(tempfile.mkdtemp(dir=self._uploads))
        path = folder / _safe_name(name)
        path.write_bytes(data)
        self._upload_names[str(path)] = name
        return path

    def _plain(self, message: str) -> str:
        """An error message with saved uploads called by the names the user gave them."""
        for path, name in self._upload_names.items():
            message = message.replace(path, name)
        return message

    def apply(self, model: Path, devices: str, mode: str, load: LoadSetting) -> Applied:
        """Re-partition / re-provision if anything changed, then set the load.

        On any failure the running network keeps serving and the error comes back."""
        with self.lock:
            live = self.live
            self._view = None
            changed = (Path(model).resolve() != live.model.resolve()
                       or devices.strip() != live.devices_spec or mode != live.mode)
            message = "nothing to re-plan"
            if changed:
                try:
                    plan = live.repartition(mode=mode, devices=devices.strip(), model=model)
                except PrismError as exc:
                    return Applied(f"kept {live.network} running", error=self._plain(str(exc)))
                except Exception as exc:  # never take the dashboard down with it
                    return Applied(f"kept {live.network} running",
                                   error=self._plain(f"{type(exc).__name__}: {exc}"))
                n = len(plan.partitions)
                message = (f"re-planned {Path(model).name}: {n} partition{'s' * (n != 1)} "
                           f"({mode}) on {live.devices_spec}")
            self._set_load(load)
            return Applied(message)

    def _set_load(self, load: LoadSetting) -> None:
        live = self.live
        live.rate, live.concurrency = load.rate, load.clients
        gen = live.load
        if gen is None:
            return
        if load.rate is not None and gen.rate is not None:
            gen.rate = load.rate  # read before every arrival
        elif load.clients is not None and gen.concurrency is not None:
            if load.clients != gen.concurrency:
                gen.scale(load.clients / gen.concurrency)
        else:  # open <-> closed loop: a new generator (LiveRuntime has no public call yet)
            paused = live.paused
            live._stop_load()
            live._start_load(paused)

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self.live.close()
            shutil.rmtree(self._uploads, ignore_errors=True)
