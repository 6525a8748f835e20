"""An embedded runtime under live load, shared by the terminal and browser dashboards.

The UIs never touch runtime threads: they call `poll()` on their own timer, which
drains the event bus into `Metrics` and returns a `LiveView`, a plain record of what
to draw. Controls (pause, faster, slower, re-partition, record) are plain methods.
A `LiveRuntime` can also replay a recorded JSON-lines file instead of running.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.loadgen import LoadGenerator
from runtime.devices import DeviceConfig, parse_devices
from runtime.devices.manager import DeviceStats
from runtime.errors import DeviceMemoryError, PrismError
from runtime.events import Event, JsonlRecorder, read_jsonl
from runtime.graph import Graph, load_graph
from runtime.host import HostManager
from runtime.metrics import Metrics, MetricsSnapshot
from runtime.partition import MODES, Plan, Step, partition_steps, replay
from runtime.partition.record import finish, tap
from runtime.partition.steps import Replay

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
DEFAULT_MODEL = SAMPLES / "cnn.onnx"
DEFAULT_DEVICES = "cpu:2,sim:2:mem=256MB"
DEFAULT_RATE = 150.0


@dataclass(frozen=True)
class LiveView:
    """Everything a dashboard draws, at one moment."""

    network: str
    mode: str
    devices_spec: str
    plan: Plan | None
    metrics: MetricsSnapshot
    devices: dict[str, DeviceStats]
    paused: bool
    load: str  # "150 req/s" or "8 clients"
    recording: str | None
    replaying: bool
    errors: list[str] = field(default_factory=list)


class Stepper:
    """The partitioner's steps for one graph, devices and mode, to walk through."""

    def __init__(self, graph: Graph, devices: list[DeviceConfig], mode: str):
        self.graph, self.mode = graph, mode
        self.steps: list[Step] = []
        self.plan = finish(tap(partition_steps(graph, devices, mode), self.steps.append))
        self.index = 0

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def step(self) -> Step:
        return self.steps[self.index]

    def go(self, index: int) -> Step:
        self.index = max(0, min(len(self.steps) - 1, index))
        return self.step

    def next(self) -> Step:
        return self.go(self.index + 1)

    def previous(self) -> Step:
        return self.go(self.index - 1)

    def end(self) -> Step:
        return self.go(len(self.steps) - 1)

    def state(self) -> Replay:
        """Node -> partition and partition -> device after the current step."""
        return replay(self.steps[: self.index + 1])


class LiveRuntime:
    def __init__(self, model: str | Path | None = None, devices: str | None = None,
                 mode: str = "balanced", *, rate: float | None = None,
                 concurrency: int | None = None, replay_file: str | Path | None = None,
                 start_load: bool = True, seed: int | None = None):
        if mode not in MODES or mode == "user":
            raise PrismError(f"dashboard mode must be memory or balanced, got {mode!r}")
        self.model = Path(model) if model else DEFAULT_MODEL
        self.devices_spec = devices or DEFAULT_DEVICES
        self.mode = mode
        self.network = self.model.stem
        self.rate = rate if rate is not None or concurrency is not None else DEFAULT_RATE
        self.concurrency = concurrency
        self.seed = seed
        self._generation = 0
        self.metrics = Metrics()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._recorder: JsonlRecorder | None = None
        self._record_path: str | None = None
        self.load: LoadGenerator | None = None
        self.host: HostManager | None = None
        self.plan: Plan | None = None
        self.graph: Graph | None = None
        self._replay: list[Event] | None = None
        if replay_file is not None:
            self._replay = list(read_jsonl(replay_file))
            self.metrics.feed(self._replay)
            loaded = [e for e in self._replay if e.kind == "network.loaded"]
            if loaded and loaded[-1].get("mode") in MODES and loaded[-1].get("mode") != "user":
                self.mode = loaded[-1].get("mode")  # the recorded plan, not today's default
            self.graph = load_graph(self.model, name=self.network)
            self.plan = finish(partition_steps(self.graph, parse_devices(self.devices_spec),
                                               mode))
            return
        self.host = HostManager(parse_devices(self.devices_spec), max_queue=1000)
        self._subscription = self.host.bus.subscribe(maxlen=100_000)
        self._load_network()
        if start_load:
            self._start_load()

    # -- set-up -----------------------------------------------------------------------

    def _load_network(self) -> None:
        self.plan = self.host.add_network(self.network, self.model, partition=self.mode)
        self.graph = self.host.graph(self.network)

    def _start_load(self, paused: bool = False) -> None:
        self.load = LoadGenerator(self.host, self.network, rate=self.rate,
                                  concurrency=self.concurrency, seed=self.seed, timeout=10.0)
        if paused:
            self.load.pause()
        self.load.start()

    # -- the view ---------------------------------------------------------------------

    def poll(self) -> LiveView:
        """Drain new events into the metrics and describe the present. UI thread only."""
        if self._replay is not None:
            snapshot = self.metrics.snapshot(self._replay[-1].ts if self._replay else None)
            devices: dict[str, DeviceStats] = {}
        else:
            self.metrics.feed(self._subscription.drain())
            snapshot = self.metrics.snapshot()
            devices = {name: m.stats() for name, m in self.host.devices.items()}
        return LiveView(self.network, self.mode, self.devices_spec, self.plan, snapshot,
                        devices, self.paused, self.load_label, self._record_path,
                        self._replay is not None, list(snapshot.errors or self.errors))

    @property
    def paused(self) -> bool:
        return self.load is None or self.load.paused

    @property
    def load_label(self) -> str:
        if self.load is None:
            return "no load"
        if self.load.rate is not None:
            return f"{self.load.rate:.0f} req/s"
        return f"{self.load.concurrency} clients"

    # -- controls ---------------------------------------------------------------------

    def toggle_pause(self) -> None:
        if self.load is None:
            if self.host is not None:  # started without load: start it now
                self._start_load()
            return
        self.load.resume() if self.load.paused else self.load.pause()

    def faster(self) -> None:
        self._scale(1.5)

    def slower(self) -> None:
        self._scale(1 / 1.5)

    def _scale(self, factor: float) -> None:
        """Change the load and remember it, so a re-partition keeps the new speed."""
        if self.load is not None:
            self.load.scale(factor)
            self.rate, self.concurrency = self.load.rate, self.load.concurrency

    def next_mode(self) -> str:
        return "memory" if self.mode == "balanced" else "balanced"

    def repartition(self, mode: str | None = None, devices: str | None = None,
                    model: str | Path | None = None) -> Plan:
        """Re-plan and re-provision the running host; load carries on afterwards.

        On a bad model or devices the old network keeps serving and the error is raised.
        """
        if self.host is None:
            raise PrismError("a replay cannot re-partition")
        with self._lock:
            new_model = Path(model) if model else self.model
            new_mode = mode or self.mode
            new_devices = devices or self.devices_spec
            if new_devices != self.devices_spec:
                parse_devices(new_devices)  # a bad spec fails here, before anything stops
                self._replace_host(new_devices, new_model, new_mode)
            else:
                self._replace_network(new_model, new_mode)
            return self.plan

    def _replace_network(self, model: Path, mode: str) -> None:
        """Load the new plan beside the old one (the old keeps serving if it fails), then
        switch the load over. If both do not fit, the old one goes first and comes back
        should the new one fail."""
        self._generation += 1
        name, old = f"{model.stem}#{self._generation}", self.network
        paused = self.paused
        try:
            self.host.add_network(name, model, partition=mode)
            self._stop_load()
        except DeviceMemoryError:
            self._stop_load()
            self.host.remove_network(old, timeout=10.0)
            try:
                self.host.add_network(name, model, partition=mode)
            except PrismError:
                self.host.add_network(old, self.model, partition=self.mode)
                self._start_load(paused)
                raise
        else:
            self.host.remove_network(old, timeout=10.0)
        self.network, self.model, self.mode = name, model, mode
        self.plan, self.graph = self.host.plan(name), self.host.graph(name)
        self.metrics = Metrics()
        self._start_load(paused)

    def _replace_host(self, devices: str, model: Path, mode: str) -> None:
        probe = HostManager(parse_devices(devices))
        try:
            probe.add_network("probe", model, partition=mode)  # may raise: old stays
        finally:
            probe.close(timeout=5.0)
        paused = self.paused
        self._stop_load()
        recording = self._record_path
        self.stop_recording()
        self.host.close(timeout=10.0)
        self.host = HostManager(parse_devices(devices), max_queue=1000)
        self._subscription = self.host.bus.subscribe(maxlen=100_000)
        self.metrics = Metrics()
        self.devices_spec, self.model, self.mode = devices, model, mode
        self.network = model.stem
        self._load_network()
        self._start_load(paused)
        if recording:
            self.start_recording(recording)

    def stepper(self, mode: str | None = None) -> Stepper:
        return Stepper(self.graph, parse_devices(self.devices_spec), mode or self.mode)

    def start_recording(self, path: str | Path) -> str:
        if self.host is None:
            raise PrismError("a replay cannot be recorded again")
        self.stop_recording()
        self._recorder = JsonlRecorder(self.host.bus, path)
        self._record_path = str(path)
        for manager in self.host.devices.values():  # a replay starts with today's memory
            manager.publish_memory()
        return self._record_path

    def stop_recording(self) -> str | None:
        path, self._record_path = self._record_path, None
        if self._recorder is not None:
            self._recorder.stop()
            self._recorder = None
        return path

    def toggle_recording(self, path: str | Path | None = None) -> str | None:
        """Start recording (to `path`, or a timestamped file) or stop; returns the path."""
        if self._recorder is not None:
            return self.stop_recording()
        return self.start_recording(path or f"prism-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")

    def _stop_load(self) -> None:
        if self.load is not None:
            self.load.stop(timeout=5.0)
            self.load = None

    def close(self) -> None:
        """Stop load, recording and the host; returns once every thread has ended."""
        self._stop_load()
        self.stop_recording()
        if self.host is not None:
            self.host.close(timeout=10.0)
            self.host = None
