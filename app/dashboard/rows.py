"""The dashboards' tables: one row per device and one per partition of the running plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.dashboard.colors import NO_COLOR
from runtime.devices.device import DeviceStats
from runtime.observe.metrics import MetricsSnapshot
from runtime.partition import Plan


@dataclass(frozen=True)
class DeviceRow:
    name: str
    backend: str
    color: str
    used_bytes: int
    total_bytes: int
    utilisation: float  # share of the window the device was running a partition
    queue_length: int
    runs: int
    node: str = ""  # the Ray node a `ray` device runs on
    health: str = "ok"  # "recovering", "lost"

    @property
    def memory_share(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def where(self) -> str:
        """The backend, and the node for a device in another process: `ray @ 10.0.0.5`."""
        return f"{self.backend} @ {self.node}" if self.node else self.backend


@dataclass(frozen=True)
class PartitionRow:
    """A partition of the running plan and its run times (seconds) so far."""

    name: str
    device: str
    color: str
    nodes: int
    est_seconds: float
    runs: int = 0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    last: float = 0.0
    mean_wait: float = 0.0
    slowest: bool = False  # the highest median of the plan's partitions

    @property
    def off_by(self) -> float | None:
        """How far the plan's estimate is from the measured median, as a share of the
        median (+0.2: estimated 20% above it), or None before a run."""
        return self.est_seconds / self.p50 - 1.0 if self.runs and self.p50 > 0 else None


def device_rows(plan: Plan | None, counters: Mapping[str, DeviceStats],
                metrics: MetricsSnapshot, colors: Mapping[str, str]) -> list[DeviceRow]:
    """A row per device: the devices' own counts where the source has them, else (a
    recording) what the events said, memory as planned if loaded before the recording
    began; utilisation always from the events (busy time over the window)."""
    configs = {d.name: d for d in plan.devices} if plan is not None else {}
    planned = plan.device_memory() if plan is not None else {}
    names = list(dict.fromkeys([*(counters or configs), *metrics.devices]))
    rows = []
    for name in names:
        seen = metrics.devices.get(name)
        util = seen.utilisation if seen else 0.0
        color = colors.get(name, NO_COLOR)
        own = counters.get(name)
        if own is not None:
            rows.append(DeviceRow(name, own.backend, color, own.used_bytes, own.total_bytes,
                                  util, own.queue_length, own.runs, own.node, own.health))
            continue
        config = configs.get(name)
        rows.append(DeviceRow(
            name, config.backend if config else "?", color,
            seen.used_bytes if seen and seen.used_bytes else planned.get(name, 0),
            seen.total_bytes if seen and seen.total_bytes else
            (config.memory_bytes or 0 if config else 0),
            util, seen.queue_length if seen else 0, seen.runs if seen else 0))
    return rows


def partition_rows(plan: Plan | None, network: str, metrics: MetricsSnapshot,
                   colors: Mapping[str, str]) -> list[PartitionRow]:
    """A row per partition of `plan`, in plan order, with the run times measured for it
    under `network`."""
    if plan is None:
        return []
    own = {(p.name, p.device) for p in plan.partitions}
    stats = {}  # a partition that ran on several devices (replicas): the plan's own device's
    for ran in sorted((s for s in metrics.partitions.values() if s.network == network),
                      key=lambda s: (s.partition, s.device) in own):
        stats[ran.partition] = ran
    measured = [s for s in stats.values() if s.count]
    slowest = max(measured, key=lambda s: s.p50).partition if measured else None
    rows = []
    for p in plan.partitions:
        s = stats.get(p.name)
        if s is None:
            rows.append(PartitionRow(p.name, p.device, colors.get(p.device, NO_COLOR),
                                     len(p.nodes), p.est_seconds))
            continue
        device = s.device or p.device
        rows.append(PartitionRow(p.name, device, colors.get(device, NO_COLOR), len(p.nodes),
                                 p.est_seconds, s.count, s.p50, s.p95, s.p99, s.last,
                                 s.mean_queue_wait, p.name == slowest))
    return rows
