"""An embedded runtime under live load: the in-process RuntimeSource both dashboards use.

`LiveRuntime` owns a HostManager, a load generator and an optional recording. The view
model (`app.dashboard`) reads it through the RuntimeSource protocol only: the bus's events,
the plan and its graph's outline, the devices' own counts. Controls (pause, faster, slower,
re-partition with another mode, devices or model, record) are plain methods; a bad change
leaves the old network serving and raises.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from pathlib import Path

from app.dashboard.source import (
    MODES,
    BundleInfo,
    LoadSetting,
    LoadState,
    PartitionSteps,
    Status,
)
from app.defaults import DEFAULT_MODEL, DEFAULT_RATE, default_devices, default_rate
from app.given_inputs import inputs_for
from app.loadgen import LoadGenerator
from runtime.bundle.contents import open_contents
from runtime.bundle.reader import is_bundle
from runtime.cost import CostModel
from runtime.devices import parse_devices
from runtime.devices.device import DeviceStats
from runtime.errors import DeviceMemoryError, PrismError
from runtime.host import HostManager
from runtime.observe.events import Event, JsonlRecorder, write_jsonl
from runtime.partition import Plan
from runtime.partition.dot import Outline
from runtime.partition.planning import live_costs

MAX_QUEUE = 1000
EVENTS_KEPT = 100_000  # events the dashboard's subscription holds between two polls


def dashboard_mode(mode: str) -> str:
    if mode not in MODES:
        raise PrismError(f"dashboard mode must be {' or '.join(MODES)}, got {mode!r}")
    return mode


class LiveRuntime:
    def __init__(self, model: str | Path | None = None, devices: str | None = None,
                 mode: str = "balanced", *, rate: float | None = None,
                 concurrency: int | None = None, start_load: bool = True,
                 seed: int | None = None, remap: Mapping[str, str] | None = None,
                 inputs: str | Path | None = None, bindings: Mapping[str, int] | None = None):
        self.model = Path(model) if model else DEFAULT_MODEL
        self._remap = (self.model.resolve(), dict(remap or {}))  # for that bundle only
        self._bound = (self.model.resolve(), dict(bindings or {}))  # that model's sizes
        # one request's feeds (`--inputs`), for that model only: sent, and measured on
        self._given = (self.model.resolve(), inputs_for(self.model, inputs)) if inputs \
            else None
        self.devices_spec = devices or default_devices(self.model)
        self.mode = mode if is_bundle(self.model) else dashboard_mode(mode)  # a bundle: its own
        self.network = self.model.stem
        self.rate = rate if rate is not None or concurrency is not None else DEFAULT_RATE
        self._rate_fits_plan = rate is None and concurrency is None  # until the user sets one
        self.concurrency = concurrency
        self.seed = seed
        self._generation = 0
        self._serving_since: dict[str, float] = {}  # network -> when its load ended
        self._recorder: JsonlRecorder | None = None
        self._record_path: str | None = None
        self.load: LoadGenerator | None = None
        self.host: HostManager | None = HostManager(parse_devices(self.devices_spec),
                                                    max_queue=MAX_QUEUE)
        self._subscription = self.host.bus.subscribe(maxlen=EVENTS_KEPT)
        self._load_network()
        if start_load:
            self._start_load()

    def _running(self) -> HostManager:
        if self.host is None:
            raise PrismError("the dashboard's runtime is closed")
        return self.host

    def _load_network(self) -> None:
        host = self._running()
        self._plan = self._add(host, self.network, self.model,  # a bundle: its own mode
                               None if is_bundle(self.model) else self.mode)
        self.mode = self._plan.mode
        self._outline = Outline.of(host.graph(self.network))

    def _add(self, host: HostManager, name: str, model: Path, mode: str | None,
             costs: CostModel | None = None) -> Plan:
        """`add_network`, with `--remap` for the bundle it was given for."""
        path, remap = self._remap
        self._serving_since[name] = math.inf
        plan = host.add_network(name, model, partition=mode, costs=costs,
                                remap=remap if remap and model.resolve() == path else None,
                                sample_feeds=None if is_bundle(model) else self._feeds(model),
                                bindings=self._bindings(model) or None)
        self._serving_since[name] = time.monotonic()
        return plan

    def _feeds(self, model: Path) -> dict | None:
        """The feeds given for `model`, or None (another model's load is made up)."""
        return self._given[1] if self._given and model.resolve() == self._given[0] else None

    def _bindings(self, model: Path) -> dict[str, int]:
        """The sizes given for `model`'s dimensions (another model's are its defaults)."""
        return self._bound[1] if model.resolve() == self._bound[0] else {}

    def _start_load(self, paused: bool = False) -> None:
        host = self._running()
        if self._rate_fits_plan:
            self.rate = default_rate(self._plan.bottleneck_seconds, host.replicas(self.network))
        self.load = LoadGenerator(host, self.network, rate=self.rate,
                                  concurrency=self.concurrency, seed=self.seed, timeout=10.0,
                                  feeds=self._feeds(self.model),
                                  bindings=self._bindings(self.model))
        if paused:
            self.load.pause()
        self.load.start()

    def _stop_load(self) -> None:
        if self.load is not None:
            self.load.stop(timeout=5.0)
            self.load = None

    # -- reading (RuntimeSource) ----------------------------------------------------------

    def drain(self) -> list[Event]:
        """The bus's new events, less the runs a first measured load timed its plan by (its
        calibration burst): the dashboards count the load's runs, as `prism run` does."""
        if self.host is None:
            return []
        since = self._serving_since
        return [e for e in self._subscription.drain() if not (
            e.kind.startswith("partition.run.") and e.ts < since.get(e.get("network"), 0.0))]

    def now(self) -> float:
        return time.monotonic()

    @property
    def paused(self) -> bool:
        return self.load is None or self.load.paused

    def state(self) -> Status:
        load = self.load
        setting = None if load is None else LoadSetting(rate=load.rate) \
            if load.rate is not None else LoadSetting(clients=load.concurrency)
        failing = load.hint(share=0.5) if load is not None else ""
        return Status(str(self.model), self.network, self.mode, self.devices_spec,
                      LoadState(setting, self.paused), self._record_path,
                      bundle=self._origin() is not None,
                      hint=f"most requests failed{failing}" if failing else "")

    def plan(self) -> Plan | None:
        """The plan serving now: the host's learner may have re-made it since it loaded
        (runtime/host/learning.py)."""
        if self.host is not None:
            with contextlib.suppress(PrismError):  # between two networks of a re-plan
                self._plan = self.host.plan(self.network)
        return self._plan

    def outline(self) -> Outline | None:
        return self._outline

    def bundle(self) -> BundleInfo | None:
        origin = self._origin()
        return None if origin is None else BundleInfo.of(origin.path, origin.manifest,
                                                         origin.devices)

    def _origin(self):
        host = self.host
        return host.bundle(self.network) if host is not None else None

    def device_stats(self) -> dict[str, DeviceStats]:
        if self.host is None:
            return {}
        return {name: device.stats() for name, device in self.host.devices.items()}

    def partition_steps(self, mode: str) -> PartitionSteps:
        """The partitioner's steps in `mode`; for a bundle in its own mode, the steps it
        recorded when it was compiled."""
        if mode == self.mode and is_bundle(self.model):
            return PartitionSteps.recorded(open_contents(self.model), self.model.stem)
        return PartitionSteps.run(self._running().graph(self.network), self.devices_spec,
                                  dashboard_mode(mode), self.model.stem)

    def networks(self) -> list[str]:
        return self.host.networks() if self.host is not None else []

    # -- load -----------------------------------------------------------------------------

    def toggle_pause(self) -> None:
        if self.load is None:
            self._start_load()  # started without load: start it now
        elif self.load.paused:
            self.load.resume()
        else:
            self.load.pause()

    def scale_load(self, factor: float) -> None:
        """Faster (>1) or slower (<1), remembered so a re-partition keeps the new speed."""
        if self.load is not None:
            self.load.scale(factor)
            self.rate, self.concurrency = self.load.rate, self.load.concurrency
            self._rate_fits_plan = False

    def set_load(self, setting: LoadSetting) -> None:
        """A new rate or client count; switching open and closed loop starts a new
        generator (paused if the old one was)."""
        self.rate, self.concurrency = setting.rate, setting.clients
        self._rate_fits_plan = False
        load = self.load
        if load is None:
            return
        if setting.rate is not None and load.rate is not None:
            load.rate = setting.rate  # read before every arrival
        elif setting.clients is not None and load.concurrency is not None:
            if setting.clients != load.concurrency:
                load.scale(setting.clients / load.concurrency)
        else:
            paused = self.paused
            self._stop_load()
            self._start_load(paused)

    # -- re-partitioning ------------------------------------------------------------------

    def repartition(self, mode: str | None = None, devices: str | None = None,
                    model: str | Path | None = None) -> Plan:
        """Re-plan and re-provision the running host; load carries on afterwards.

        On a bad model or devices the old network keeps serving and the error is raised.
        """
        new_model = Path(model) if model else self.model
        new_mode: str | None = mode  # a bundle's: its own, or refused as it loads
        if not is_bundle(new_model):
            new_mode = dashboard_mode(mode or (self.mode if self.mode in MODES else MODES[0]))
        new_devices = devices or self.devices_spec
        if new_devices != self.devices_spec:
            parse_devices(new_devices)  # a bad spec fails here, before anything stops
            self._replace_host(new_devices, new_model, new_mode)
        else:
            self._replace_network(new_model, new_mode)
        return self._plan

    def replan_measured(self, seconds: Mapping[str, float]) -> Plan:
        """Re-plan the running network with its partitions' measured run times
        (`planning.live_costs`): load the new plan beside the old, then switch the load."""
        if is_bundle(self.model):
            raise PrismError(f"{self.model.name} is a bundle, planned when it was compiled: "
                             f"recompile it to plan it again")
        host = self._running()
        costs = live_costs(host.graph(self.network), host.plan(self.network), seconds)
        self._replace_network(self.model, self.mode, costs)
        return self._plan

    def _replace_network(self, model: Path, mode: str | None,
                         costs: CostModel | None = None) -> None:
        """Load the new plan beside the old one (the old keeps serving if it fails), then
        switch the load over. If both do not fit, the old one goes first and comes back
        should the new one fail."""
        host = self._running()
        self._generation += 1
        name, old = f"{model.stem}#{self._generation}", self.network
        paused = self.paused
        try:
            self._add(host, name, model, mode, costs)
            self._stop_load()
        except DeviceMemoryError:
            self._stop_load()
            host.remove_network(old, timeout=10.0)
            try:
                self._add(host, name, model, mode, costs)
            except PrismError:
                self._add(host, old, self.model, self.mode)
                self._start_load(paused)
                raise
        else:
            host.remove_network(old, timeout=10.0)
        self.network, self.model = name, model
        self._plan, self._outline = host.plan(name), Outline.of(host.graph(name))
        self.mode = self._plan.mode
        self._start_load(paused)

    def _replace_host(self, devices: str, model: Path, mode: str | None) -> None:
        probe = HostManager(parse_devices(devices))
        try:
            self._add(probe, "probe", model, mode)  # old stays
        finally:
            probe.close(timeout=5.0)
        paused = self.paused
        self._stop_load()
        recording = self.stop_recording()
        self._running().close(timeout=10.0)
        self.host = HostManager(parse_devices(devices), max_queue=MAX_QUEUE)
        self._subscription = self.host.bus.subscribe(maxlen=EVENTS_KEPT)
        self.devices_spec, self.model, self.mode = devices, model, mode or self.mode
        self.network = model.stem
        self._load_network()
        self._start_load(paused)
        if recording:
            self._record(recording, append=True)

    # -- recording ------------------------------------------------------------------------

    def start_recording(self, path: str | Path) -> str:
        self.stop_recording()
        return self._record(path, append=False)

    def _record(self, path: str | Path, append: bool) -> str:
        """Record the bus to `path`, opening with the state a replay starts from: the
        network as loaded (mode, devices and their spec) and each device's memory."""
        host, now = self._running(), time.monotonic()
        origin = self._origin()
        opening = [Event("network.loaded", now, {
            "network": self.network, "mode": self.mode, "partitions": len(self._plan.partitions),
            "devices": sorted({p.device for p in self._plan.partitions}),
            "nodes": len(self._outline.ops), "spec": self.devices_spec,
            **({} if origin is None else {"bundle": origin.path, "placed": origin.devices})})]
        opening += [Event("device.memory", now, {"device": c.name, "used_bytes": c.used_bytes,
                                                  "total_bytes": c.total_bytes})
                    for c in self.device_stats().values()]
        with open(path, "a" if append else "w", encoding="utf-8") as fp:
            write_jsonl(opening, fp)
        self._recorder = JsonlRecorder(host.bus, path, append=True)
        self._record_path = str(path)
        return self._record_path

    def stop_recording(self) -> str | None:
        path, self._record_path = self._record_path, None
        if self._recorder is not None:
            self._recorder.stop()
            self._recorder = None
        return path

    def close(self) -> None:
        """Stop load, recording and the host; returns once every thread has ended."""
        self._stop_load()
        self.stop_recording()
        if self.host is not None:
            self.host.close(timeout=10.0)
            self.host = None
