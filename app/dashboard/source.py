"""What a dashboard reads of a runtime, and may change in it: the `RuntimeSource` protocol.

A source is the event stream (`drain`) plus a few queries and the controls. The view model
reads nothing else, so the runtime can be embedded (`app.live.LiveRuntime`, over a
HostManager), a recording (`app.replay.Recording`), or another process. Every record a
source hands over is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runtime.bundle.contents import Contents
from runtime.devices import parse_devices
from runtime.devices.device import DeviceStats
from runtime.errors import PrismError
from runtime.graph import Graph
from runtime.observe.events import Event
from runtime.partition import Plan, Step
from runtime.partition.dot import Outline
from runtime.partition.planning import plan_network

MODES = ("balanced", "memory")  # the modes a dashboard switches between


@dataclass(frozen=True)
class LoadSetting:
    """Open loop at `rate` requests/s, or closed loop with `clients` waiting clients."""

    rate: float | None = None
    clients: int | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.clients is None):
            raise PrismError("load: give either a rate or a number of clients")

    @property
    def label(self) -> str:
        return f"{self.rate:.0f} req/s" if self.rate is not None else f"{self.clients} clients"


@dataclass(frozen=True)
class LoadState:
    """The load generator: its setting (None: there is none) and whether it is paused."""

    setting: LoadSetting | None = None
    paused: bool = True

    @property
    def label(self) -> str:
        return self.setting.label if self.setting is not None else "no load"


@dataclass(frozen=True)
class Status:
    """What the source runs: `network` is the runtime's name for it (`cnn#2` after a
    re-plan), `model_path` the file it was loaded from; `replay` the recording, if any."""

    model_path: str
    network: str
    mode: str
    devices: str  # the device spec
    load: LoadState = LoadState()
    recording: str | None = None
    replay: str | None = None
    bundle: bool = False  # loaded from a bundle (model_path is it): planned ahead of time
    training: bool = False  # a training run (`prism train --tui/--web`), not served
    hint: str = ""  # how to make the load's requests succeed, where most have failed

    @property
    def model(self) -> str:
        return Path(self.model_path).stem

    @property
    def changeable(self) -> bool:
        """Load, plan and recording can be changed (not in a replay nor a training run)."""
        return self.replay is None and not self.training


@dataclass(frozen=True)
class ScheduleRow:
    """One row of a bundle's schedule table: a partition, the device it runs on here, the
    tensors it reads and writes and the rows it waits for (`after`)."""

    partition: str
    device: str
    backend: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    after: tuple[str, ...]
    color: str = ""  # the device's colour (the view model sets it)


@dataclass(frozen=True)
class BundleInfo:
    """Where a network compiled ahead of time came from: the bundle, what made it, and its
    schedule on this host's devices."""

    path: str
    made_with: str  # "prism 0.1.0, onnx 1.19.0, onnxruntime 1.23.2"
    schedule: tuple[ScheduleRow, ...]

    @property
    def name(self) -> str:
        return Path(self.path).name

    @classmethod
    def of(cls, path: str, manifest: Mapping, placed: Mapping[str, str]) -> BundleInfo:
        """From a bundle's manifest; `placed` maps its devices to the host's."""
        made = manifest.get("created_with", {})
        rows = tuple(ScheduleRow(r["partition"], placed.get(r["device"], r["device"]),
                                 r["backend"], tuple(r["reads"]), tuple(r["writes"]),
                                 tuple(r["after"])) for r in manifest["schedule"])
        return cls(str(path), ", ".join(f"{k} {made[k]}" for k in ("prism", "onnx", "onnxruntime")
                                        if k in made), rows)


@dataclass(frozen=True)
class PartitionSteps:
    """The partitioner's steps for one model, mode and devices, and the plan they end in."""

    model: str
    mode: str
    devices: str
    steps: tuple[Step, ...]
    plan: Plan
    outline: Outline

    @classmethod
    def run(cls, graph: Graph, devices: str, mode: str, model: str) -> PartitionSteps:
        """Run the partitioner on `graph` over the `devices` spec, keeping every step, with
        the costs a host plans with (measured ones come from the cache its load filled)."""
        steps, plan = plan_network(graph, parse_devices(devices), mode)
        return cls(model, mode, devices, tuple(steps), plan, Outline.of(graph))

    @classmethod
    def recorded(cls, contents: Contents, model: str) -> PartitionSteps:
        """The steps a bundle recorded when it was compiled (`open_contents`), and the
        plan they made on the devices it was compiled for: nothing is partitioned again."""
        devices = ", ".join(d.name for d in contents.plan.devices)
        return cls(model, contents.plan.mode, f"{devices} (compiled)", tuple(contents.steps),
                   contents.plan, Outline.of(contents.graph))


class RuntimeSource(Protocol):
    def drain(self) -> list[Event]:
        """The events published since the last call."""
        ...

    def now(self) -> float:
        """The present, on the events' clock."""
        ...

    def state(self) -> Status: ...

    def plan(self) -> Plan | None:
        """The running plan: the same object until it changes."""
        ...

    def outline(self) -> Outline | None:
        """The running plan's graph."""
        ...

    def bundle(self) -> BundleInfo | None:
        """The bundle the running network was loaded from, or None (loaded from ONNX)."""
        ...

    def device_stats(self) -> dict[str, DeviceStats]:
        """Each device's own counts; empty where the source has none (a recording)."""
        ...

    def partition_steps(self, mode: str) -> PartitionSteps: ...

    def networks(self) -> list[str]: ...

    # controls: a source that cannot (a recording) raises PrismError saying so

    def toggle_pause(self) -> None: ...

    def scale_load(self, factor: float) -> None: ...

    def set_load(self, setting: LoadSetting) -> None: ...

    def repartition(self, mode: str | None = None, devices: str | None = None,
                    model: str | Path | None = None) -> Plan: ...

    def replan_measured(self, seconds: Mapping[str, float]) -> Plan:
        """Re-plan the running network on the run times its partitions showed (`seconds`:
        partition -> median run time), as `repartition` does."""
        ...

    def start_recording(self, path: str | Path) -> str: ...

    def stop_recording(self) -> str | None: ...

    def close(self) -> None: ...


class ReadOnly:
    """The controls of a source nothing can change (a recording, a server): each raises
    the source's own one-line refusal, `_refuse(what)`."""

    def _refuse(self, what: str) -> PrismError:
        raise NotImplementedError

    def toggle_pause(self) -> None:
        raise self._refuse("pause the load")

    def scale_load(self, factor: float) -> None:
        raise self._refuse("change the load")

    def set_load(self, setting: LoadSetting) -> None:
        raise self._refuse("change the load")

    def repartition(self, mode: str | None = None, devices: str | None = None,
                    model: str | Path | None = None) -> Plan:
        raise self._refuse("re-partition")

    def replan_measured(self, seconds: Mapping[str, float]) -> Plan:
        raise self._refuse("re-plan from measurements")

    def start_recording(self, path: str | Path) -> str:
        raise self._refuse("record")

    def stop_recording(self) -> str | None:
        return None
