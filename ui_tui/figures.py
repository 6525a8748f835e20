"""A LiveView turned into the rows and series the widgets draw. Pure functions, no Textual."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.live import LiveView
from runtime.metrics import slowest_partition
from runtime.partition import Partition

QUEUE_WINDOW = 60  # seconds of queue depth on the dashboard
NO_COLOR = "#808080"


@dataclass(frozen=True)
class DeviceRow:
    name: str
    backend: str
    color: str
    used_bytes: int
    total_bytes: int
    utilisation: float
    queue_length: int
    runs: int


@dataclass(frozen=True)
class LatencyRow:
    partition: str
    device: str
    color: str
    count: int
    p50: float
    p95: float
    p99: float
    last: float
    slowest: bool


def device_colors(view: LiveView) -> dict[str, str]:
    return view.plan.colors() if view.plan is not None else {}


def device_rows(view: LiveView) -> list[DeviceRow]:
    """One row per device: the device managers' own counts where running, else (a replay)
    what the events said; utilisation always from the events (busy time over the window)."""
    colors = device_colors(view)
    backends = {d.name: d.backend for d in view.plan.devices} if view.plan else {}
    planned = view.plan.device_memory() if view.plan else {}
    capacity = {d.name: d.memory_bytes for d in view.plan.devices} if view.plan else {}
    names = list(view.devices) or list(backends) or list(view.metrics.devices)
    for name in view.metrics.devices:
        if name not in names:
            names.append(name)
    rows = []
    for name in names:
        m = view.metrics.devices.get(name)
        live = view.devices.get(name)
        util = m.utilisation if m else 0.0
        if live is not None:
            rows.append(DeviceRow(name, live.backend, colors.get(name, NO_COLOR),
                                  live.used_bytes, live.total_bytes, util, live.queue_length,
                                  live.runs))
        else:  # a replay: memory as recorded, or as planned if loaded before recording
            used = m.used_bytes if m and m.used_bytes else planned.get(name, 0)
            total = m.total_bytes if m and m.total_bytes else capacity.get(name, 0)
            rows.append(DeviceRow(name, backends.get(name, "?"), colors.get(name, NO_COLOR),
                                  used, total, util, m.queue_length if m else 0,
                                  m.runs if m else 0))
    return rows


def measured_network(view: LiveView) -> str:
    """The network whose partition figures to show: the view's own, or else (a replay of a
    run that re-partitioned, where networks are renamed `cnn#2`) the last one measured."""
    keys = list(view.metrics.partitions)
    if not keys or any(k.startswith(f"{view.network}/") for k in keys):
        return view.network
    return keys[-1].rsplit("/", 1)[0]


def latency_rows(view: LiveView) -> list[LatencyRow]:
    """Per-partition run times in plan order; the one with the highest median is `slowest`."""
    if view.plan is None:
        return []
    colors = device_colors(view)
    network = measured_network(view)
    slowest = slowest_partition(view.metrics)
    rows = []
    for p in view.plan.partitions:
        key = f"{network}/{p.name}"
        s = view.metrics.partitions.get(key)
        if s is None:
            rows.append(LatencyRow(p.name, p.device, colors.get(p.device, NO_COLOR), 0,
                                   0.0, 0.0, 0.0, 0.0, False))
        else:
            rows.append(LatencyRow(p.name, s.device or p.device,
                                   colors.get(s.device or p.device, NO_COLOR), s.count,
                                   s.p50, s.p95, s.p99, s.last, key == slowest))
    return rows


def partition_latency(view: LiveView, partition: Partition) -> LatencyRow | None:
    return next((r for r in latency_rows(view) if r.partition == partition.name), None)


def queue_series(view: LiveView, seconds: int = QUEUE_WINDOW) -> list[float]:
    """Queue depth in one-second bins over the last `seconds` (the deepest in each bin);
    a bin with no sample carries the previous bin's depth. Always `seconds` long."""
    now = view.metrics.now
    bins: list[float | None] = [None] * seconds
    for ts, depth in view.metrics.queue_depth:
        i = seconds - 1 - math.floor(now - ts)
        if 0 <= i < seconds:
            bins[i] = max(bins[i] or 0, depth)
    out, carry = [], 0.0
    for b in bins:
        carry = float(b) if b is not None else carry
        out.append(carry)
    return out


def throughput_series(view: LiveView, seconds: int = QUEUE_WINDOW) -> list[float]:
    """Requests finished in each of the last `seconds` one-second bins, zero-padded."""
    counts = [c for _, c in view.metrics.throughput_series][-seconds:]
    return [0.0] * (seconds - len(counts)) + counts


def current_queue_depth(view: LiveView) -> int:
    return view.metrics.queue_depth[-1][1] if view.metrics.queue_depth else 0
