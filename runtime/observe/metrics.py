"""Turns bus events into the figures that dashboards and `prism run` show.

No threads: callers feed drained (or replayed) events and take snapshots. Windowed figures
are relative to the snapshot's `now`, which should not be earlier than the last event fed
(state older than the window before the newest event is pruned as events arrive).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.observe.events import Event

ERRORS_KEPT = 20


@dataclass(frozen=True, slots=True)
class Percentiles:
    """`count` is every value seen; the rest cover the most recent `samples` values."""

    count: int = 0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    last: float = 0.0
    mean: float = 0.0


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """Run time figures (seconds) of one partition, from partition.run.finished."""

    network: str
    partition: Any
    device: str | None
    count: int
    p50: float
    p95: float
    p99: float
    last: float
    mean: float
    mean_queue_wait: float


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device as the event stream shows it, over the window (`devices.DeviceStats` is
    the same device's own counters, read from the device)."""

    device: str
    runs: int = 0
    busy_seconds: float = 0.0
    utilisation: float = 0.0
    used_bytes: int = 0
    total_bytes: int = 0
    queue_length: int = 0


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    now: float
    requests_finished: int = 0
    requests_failed: int = 0
    throughput: float = 0.0
    latency: Percentiles = Percentiles()
    queue_wait: Percentiles = Percentiles()
    batch_sizes: Percentiles = Percentiles()
    # "network/partition"; "network/partition@device" for one that ran on several devices
    # (its replicas, or a plan re-made onto another)
    partitions: dict[str, PartitionStats] = field(default_factory=dict)
    devices: dict[str, DeviceUsage] = field(default_factory=dict)
    queue_depth: list[tuple[float, int]] = field(default_factory=list)
    throughput_series: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failed requests, replaced workers
    lost_events: int = 0


class _Reservoir:
    __slots__ = ("count", "last", "values")

    def __init__(self, samples: int) -> None:
        self.values: deque[float] = deque(maxlen=samples)
        self.count = 0
        self.last = 0.0

    def add(self, v: Any) -> None:
        if v is not None:
            self.values.append(float(v))
            self.count += 1
            self.last = float(v)

    def summary(self) -> Percentiles:
        if not self.values:
            return Percentiles()
        a = np.fromiter(self.values, float, len(self.values))
        p50, p95, p99 = np.percentile(a, (50, 95, 99))
        return Percentiles(self.count, float(p50), float(p95), float(p99), self.last,
                           float(a.mean()))


@dataclass(slots=True)
class _Part:
    network: str
    partition: Any
    device: str | None
    runs: _Reservoir
    wait_sum: float = 0.0
    wait_n: int = 0


@dataclass(slots=True)
class _Dev:
    runs: int = 0
    busy: float = 0.0
    used: int = 0
    total: int = 0
    intervals: deque[tuple[float, float]] = field(default_factory=deque)  # (start, end)


class Metrics:
    def __init__(self, window_seconds: float = 60.0, samples: int = 2048,
                 throughput_window: float = 5.0) -> None:
        self.window = window_seconds
        self.throughput_window = throughput_window
        self.samples = samples
        self._keep = max(math.ceil(window_seconds), throughput_window) + 1.0
        self._first: float | None = None
        self._last = -math.inf
        self._finished = 0
        self._failed = 0
        self._lost = 0
        self._finished_ts: deque[float] = deque()
        self._latency = _Reservoir(samples)
        self._queue_wait = _Reservoir(samples)
        self._batch = _Reservoir(samples)
        # requests whose queue_wait/batch_size came from request.started, so that
        # request.finished does not count them twice
        self._started: set[tuple[Any, Any]] = set()
        self._parts: dict[tuple[Any, Any, str | None], _Part] = {}  # (network, partition, device)
        self._devs: dict[str, _Dev] = {}
        self._running: dict[tuple[Any, Any], dict[Any, tuple[str, float]]] = {}
        self._depth: deque[tuple[float, int]] = deque()
        self._errors: deque[str] = deque(maxlen=ERRORS_KEPT)
        self._on: dict[str, Callable[[Event], None]] = {
            "request.started": self._request_started,
            "request.finished": self._request_finished,
            "request.failed": self._request_failed,
            "partition.run.started": self._run_started,
            "partition.run.finished": self._run_finished,
            "device.memory": self._device_memory,
            "provision.loaded": self._device_seen,
            "provision.evicted": self._device_seen,
            "queue.depth": self._queue_depth,
            "device.worker.replaced": self._worker_replaced,
            "bus.lost": self._bus_lost,
        }

    def begin(self, ts: float) -> None:
        """Spans (throughput, utilisation, the window) from `ts` on, whatever events came
        before it: a run's figures, not its load's."""
        self._first = ts

    def feed(self, events: Iterable[Event]) -> None:
        on = self._on
        for ev in events:
            ts = ev.ts
            if self._first is None or ts < self._first:
                self._first = ts
            if ts > self._last:
                self._last = ts
            handler = on.get(ev.kind)
            if handler is not None:
                handler(ev)
        self._prune(self._last - self._keep)

    def _prune(self, horizon: float) -> None:
        done, depth = self._finished_ts, self._depth
        while done and done[0] < horizon:
            done.popleft()
        while depth and depth[0][0] < horizon:
            depth.popleft()
        for dev in self._devs.values():
            while dev.intervals and dev.intervals[0][1] < horizon:
                dev.intervals.popleft()

    def _dev(self, name: str | None) -> _Dev:
        if name is None:
            return _Dev()  # a throwaway: events without a device do not make one up
        dev = self._devs.get(name)
        if dev is None:
            dev = self._devs[name] = _Dev()
        return dev

    def _request_started(self, ev: Event) -> None:
        if len(self._started) > 65_536:  # finishes were lost; forget rather than grow
            self._started.clear()
        self._started.add((ev.get("network"), ev.get("request")))
        self._queue_wait.add(ev.get("queue_wait"))
        self._batch.add(ev.get("batch_size"))

    def _request_finished(self, ev: Event) -> None:
        key = (ev.get("network"), ev.get("request"))
        self._finished += 1
        self._finished_ts.append(ev.ts)
        self._latency.add(ev.get("latency"))
        self._running.pop(key, None)
        if key in self._started:
            self._started.discard(key)
        else:
            self._queue_wait.add(ev.get("queue_wait"))
            self._batch.add(ev.get("batch_size"))

    def _request_failed(self, ev: Event) -> None:
        net, req, part, dev = (ev.get(k) for k in ("network", "request", "partition", "device"))
        self._failed += 1
        self._started.discard((net, req))
        self._running.pop((net, req), None)
        where = " on ".join(str(x) for x in (part, dev) if x is not None)
        self._errors.append(f"{net} request {req}: {ev.get('error')}"
                            + (f" ({where})" if where else ""))

    def _run_started(self, ev: Event) -> None:
        device = ev.get("device")
        self._dev(device)
        key = (ev.get("network"), ev.get("request"))
        self._running.setdefault(key, {})[ev.get("partition")] = (device, ev.ts)

    def _run_finished(self, ev: Event) -> None:
        net, req, part, device = (ev.get(k) for k in ("network", "request", "partition",
                                                      "device"))
        running = self._running.get((net, req))
        if running is not None:
            running.pop(part, None)
            if not running:
                del self._running[(net, req)]
        p = self._parts.get((net, part, device))
        if p is None:
            p = self._parts[(net, part, device)] = _Part(net, part, device,
                                                        _Reservoir(self.samples))
        rs = ev.get("run_seconds")
        p.runs.add(rs)
        if (qw := ev.get("queue_wait")) is not None:
            p.wait_sum += qw
            p.wait_n += 1
        dev = self._dev(device)
        dev.runs += 1
        if rs is not None:
            dev.busy += rs
            dev.intervals.append((ev.ts - rs, ev.ts))

    def _worker_replaced(self, ev: Event) -> None:
        self._dev(ev.get("device"))
        self._errors.append(f"{ev.get('device')}: its worker thread died ({ev.get('error')}) "
                            f"and was replaced")

    def _device_memory(self, ev: Event) -> None:
        dev = self._dev(ev.get("device"))
        dev.used = ev.get("used_bytes", dev.used)
        dev.total = ev.get("total_bytes", dev.total)

    def _device_seen(self, ev: Event) -> None:
        self._dev(ev.get("device"))

    def _queue_depth(self, ev: Event) -> None:
        self._depth.append((ev.ts, ev.get("depth", 0)))

    def _bus_lost(self, ev: Event) -> None:
        self._lost += ev.get("lost", 0)

    def snapshot(self, now: float | None = None) -> MetricsSnapshot:
        """Figures as of `now` (default time.monotonic(); for a replay, the last event's ts)."""
        now = time.monotonic() if now is None else now
        if self._first is None:
            return MetricsSnapshot(now)
        lo = max(now - self.window, self._first)  # the window span actually covered
        span = now - lo
        done = np.sort(np.fromiter(self._finished_ts, float, len(self._finished_ts)))
        upto = int(np.searchsorted(done, now, side="right"))

        tspan = min(self.throughput_window, now - self._first)
        recent = upto - int(np.searchsorted(done, now - self.throughput_window, side="right"))
        throughput = recent / tspan if tspan > 0 else 0.0

        nb = max(1, math.ceil(min(self.window, now - self._first)))
        edges = now - np.arange(nb, -1, -1, dtype=float)
        counts = np.diff(np.searchsorted(done, edges, side="right"))
        series = [(float(e), float(c)) for e, c in zip(edges[1:], counts, strict=True)]

        queued: dict[str, int] = {}
        busy: dict[str, float] = {}
        for running in self._running.values():
            for device, start in running.values():
                queued[device] = queued.get(device, 0) + 1
                busy[device] = busy.get(device, 0.0) + max(0.0, now - max(start, lo))
        devices = {}
        for name, dev in self._devs.items():
            b = busy.get(name, 0.0) + sum(max(0.0, min(end, now) - max(start, lo))
                                          for start, end in dev.intervals)
            util = min(1.0, max(0.0, b / span)) if span > 0 else 0.0
            devices[name] = DeviceUsage(name, dev.runs, dev.busy, util, dev.used, dev.total,
                                        queued.get(name, 0))
        partitions = {}
        places = Counter((net, part) for net, part, _ in self._parts)
        for (net, part, ran_on), p in self._parts.items():
            s = p.runs.summary()
            key = f"{net}/{part}" if places[(net, part)] == 1 else f"{net}/{part}@{ran_on}"
            partitions[key] = PartitionStats(p.network, p.partition, p.device, s.count, s.p50,
                                             s.p95, s.p99, s.last, s.mean,
                                             p.wait_sum / p.wait_n if p.wait_n else 0.0)
        return MetricsSnapshot(
            now=now,
            requests_finished=self._finished,
            requests_failed=self._failed,
            throughput=throughput,
            latency=self._latency.summary(),
            queue_wait=self._queue_wait.summary(),
            batch_sizes=self._batch.summary(),
            partitions=partitions,
            devices=devices,
            queue_depth=[(t, d) for t, d in self._depth if now - self.window <= t <= now],
            throughput_series=series,
            errors=list(self._errors),
            lost_events=self._lost,
        )

