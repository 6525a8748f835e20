"""A recorded run (JSON lines) as a RuntimeSource: the dashboards replay it, unchanged.

The plan is the one the recording ran: the model partitioned in the recorded mode on the
recorded devices (the last `network.loaded` event says both; a recording made before
events carried them falls back to the given mode and devices), or, for a run of a bundle
(the event names it, or MODEL is one), the bundle's own plan on the devices it went to.
Every event comes in the first drain; the clock stands at the last event. Nothing can be
changed.
"""

from __future__ import annotations

from pathlib import Path

from app.dashboard.source import (
    MODES,
    BundleInfo,
    LoadState,
    PartitionSteps,
    ReadOnly,
    Status,
)
from app.defaults import DEFAULT_DEVICES, DEFAULT_MODEL
from runtime.bundle.contents import open_contents
from runtime.bundle.plan_io import rename_devices
from runtime.bundle.reader import is_bundle
from runtime.devices.device import DeviceStats
from runtime.errors import PrismError
from runtime.graph import load_graph
from runtime.observe.events import Event, read_jsonl
from runtime.partition import Plan
from runtime.partition.dot import Outline


class Recording(ReadOnly):
    def __init__(self, path: str | Path, model: str | Path | None = None,
                 devices: str | None = None, mode: str = "balanced") -> None:
        self.path = str(path)
        self.events = list(read_jsonl(path))
        loaded = [e for e in self.events if e.kind == "network.loaded"]
        last = loaded[-1] if loaded else None
        bundle = model if model is not None and is_bundle(model) else \
            last.get("bundle") if last is not None else None
        self.mode = last.get("mode", mode) if last is not None else mode
        self._bundle: BundleInfo | None = None
        self._drained = False
        if bundle is not None:
            self._from_bundle(Path(bundle), last, devices)
            return
        if self.mode not in MODES:
            raise PrismError(f"{self.path} was recorded in {self.mode!r} mode; a replay "
                             f"can rebuild only {' or '.join(MODES)} plans")
        specs = [e["spec"] for e in loaded if e.get("spec")]
        self.devices = devices or (specs[-1] if specs else DEFAULT_DEVICES)
        self.model = Path(model) if model else DEFAULT_MODEL
        runs = [e for e in self.events if e.kind == "partition.run.finished"]
        self.network = last["network"] if last is not None else \
            runs[-1]["network"] if runs else self.model.stem
        self._steps = PartitionSteps.run(load_graph(self.model, name=self.network),
                                         self.devices, self.mode, self.model.stem)
        self._plan = self._steps.plan

    def _from_bundle(self, path: Path, last: Event | None, devices: str | None) -> None:
        """A run of a bundle: its recorded steps, and its plan moved onto the devices the
        run put it on (the event's `placed`)."""
        contents = open_contents(path)
        placed = dict(last.get("placed") or {}) if last is not None else {}
        self.model, self.mode = path, contents.plan.mode
        self.devices = devices or (last.get("spec") if last is not None else None) or \
            ",".join(sorted(placed.values()))
        self.network = last["network"] if last is not None else path.stem
        self._steps = PartitionSteps.recorded(contents, path.stem)
        self._plan = rename_devices(contents.plan, placed)
        self._bundle = BundleInfo.of(str(path), contents.manifest, placed)

    def drain(self) -> list[Event]:
        if self._drained:
            return []
        self._drained = True
        return self.events

    def now(self) -> float:
        return self.events[-1].ts if self.events else 0.0

    def state(self) -> Status:
        return Status(str(self.model), self.network, self.mode, self.devices, LoadState(),
                      replay=self.path, bundle=self._bundle is not None)

    def plan(self) -> Plan:
        return self._plan

    def outline(self) -> Outline:
        return self._steps.outline

    def bundle(self) -> BundleInfo | None:
        return self._bundle

    def device_stats(self) -> dict[str, DeviceStats]:
        return {}

    def partition_steps(self, mode: str) -> PartitionSteps:
        if mode == self.mode:
            return self._steps
        graph = open_contents(self.model).graph if self._bundle else load_graph(
            self.model, name=self.network)
        return PartitionSteps.run(graph, self.devices, mode, self.model.stem)

    def networks(self) -> list[str]:
        return [self.network]

    def _refuse(self, what: str) -> PrismError:
        return PrismError(f"a replay cannot {what}: {self.path} is a recording")

    def close(self) -> None:
        pass
