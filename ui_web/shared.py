"""One DashboardModel per server process, shared by every browser tab.

Streamlit runs each tab's script on its own thread, so every touch of the model (polls
included: they drain the runtime's events into one set of metrics) goes through one lock.
Polls are memoised briefly, so several tabs refreshing each second cost one drain.
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

from app.dashboard import DashboardModel, DashboardView, LoadSetting, Stepper
from runtime.errors import PrismError

VIEW_MAX_AGE = 0.4  # seconds a poll is reused by other tabs


@dataclass(frozen=True)
class Applied:
    """What an Apply did: `error` is None when every change took."""

    message: str
    error: str | None = None


def _safe_name(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).stem).strip("._") or "upload"
    return f"{stem[:40]}{'.prism' if Path(name).suffix == '.prism' else '.onnx'}"


class SharedLive:
    def __init__(self, model: DashboardModel):
        self.model = model
        self.lock = threading.RLock()
        self._view: DashboardView | None = None
        self._view_at = -1.0
        self._uploads = Path(tempfile.mkdtemp(prefix="prism-web-"))
        self._upload_names: dict[str, str] = {}  # saved path -> the name the user gave
        self._closed = False

    def view(self, max_age: float = VIEW_MAX_AGE) -> DashboardView:
        """The present view (reused by other tabs for up to `max_age` seconds)."""
        with self.lock:
            now = time.monotonic()
            if self._view is None or now - self._view_at > max_age:
                self._view, self._view_at = self.model.poll(), now
            return self._view

    def stepper(self, mode: str) -> Stepper:
        with self.lock:
            return self.model.stepper(mode)

    def toggle_pause(self) -> None:
        with self.lock:
            self.model.toggle_pause()
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
            self._view = None
            kept = f"kept {self.model.status.model} running"
            try:
                return Applied(self.model.change(model, devices, mode, load))
            except PrismError as exc:
                return Applied(kept, error=self._plain(str(exc)))
            except Exception as exc:  # never take the dashboard down with it
                return Applied(kept, error=self._plain(f"{type(exc).__name__}: {exc}"))

    def replan_measured(self) -> Applied:
        """Re-plan on the running plan's measured run times; on a failure the running
        network keeps serving and the error comes back."""
        with self.lock:
            self._view = None
            kept = f"kept {self.model.status.model} running"
            try:
                plan = self.model.replan_measured()
            except PrismError as exc:
                return Applied(kept, error=self._plain(str(exc)))
            except Exception as exc:  # never take the dashboard down with it
                return Applied(kept, error=self._plain(f"{type(exc).__name__}: {exc}"))
            n = len(plan.partitions)
            return Applied(f"re-planned from measured run times: {n} partition"
                           f"{'s' * (n != 1)}, bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms")

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self.model.close()
            shutil.rmtree(self._uploads, ignore_errors=True)
