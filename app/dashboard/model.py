"""The view model both dashboards read: `DashboardModel.poll()` returns a `DashboardView`.

The model reads a RuntimeSource only (its events and a few queries), so the TUI and the web
UI lay out the same figures for an embedded runtime, a recording or, later, a server. It
owns the metrics: polling drains the source's new events into them. Not thread-safe: one
thread polls (the TUI's timer, or the web's lock holder). Controls pass to the source.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from app.dashboard.colors import NO_COLOR, device_colors
from app.dashboard.drawing import PlanDrawing
from app.dashboard.rows import DeviceRow, PartitionRow, device_rows, partition_rows
from app.dashboard.series import WINDOW, Series, binned, padded
from app.dashboard.source import MODES, BundleInfo, LoadSetting, RuntimeSource, Status
from app.dashboard.stepper import Stepper
from app.dashboard.training import TrainingTracker, TrainingView
from runtime.bundle.reader import is_bundle
from runtime.errors import PrismError
from runtime.observe.metrics import Metrics, Percentiles
from runtime.partition import Plan

FASTER = 1.5  # one press of faster (slower divides)
MIN_RUNS = 20  # runs a partition needs before its median feeds a re-plan


@dataclass(frozen=True)
class Totals:
    """Requests over the whole run (throughput: over the last few seconds)."""

    throughput: float
    finished: int
    failed: int
    latency: Percentiles  # end to end, seconds
    queue_now: int


@dataclass(frozen=True)
class DashboardView:
    """Everything a dashboard draws, at one moment."""

    status: Status
    plan: Plan | None
    drawing: PlanDrawing | None
    colors: dict[str, str]  # device -> colour
    devices: tuple[DeviceRow, ...]
    partitions: tuple[PartitionRow, ...]
    queue: Series  # deepest queue per second
    throughput: Series  # requests finished per second
    latency: Series  # median end-to-end latency per second (seconds)
    totals: Totals
    # the most recent failures (requests, workers), oldest first; last, where most requests
    # failed on made-up inputs, how to give others (`Status.hint`)
    errors: tuple[str, ...]
    bundle: BundleInfo | None = None  # the bundle it came from; its schedule, coloured
    training: TrainingView | None = None  # a training run: its loss and step timeline


class DashboardModel:
    def __init__(self, source: RuntimeSource) -> None:
        self.source = source
        self.metrics = Metrics(window_seconds=WINDOW)
        self._latencies: deque[tuple[float, float]] = deque()
        self._measuring: tuple[str, str] | None = None  # (network, devices) measured
        self._plan: Plan | None = None
        self._drawing: PlanDrawing | None = None
        self._colors: dict[str, str] = {}
        self._bundle: BundleInfo | None = None
        self.training = TrainingTracker()
        self.status = source.state()

    # -- the view -----------------------------------------------------------------------

    def poll(self) -> DashboardView:
        """Drain new events into the metrics and describe the present."""
        events = self.source.drain()
        self.status = status = self.source.state()
        if (status.network, status.devices) != self._measuring:  # a new plan: start afresh
            self._measuring = (status.network, status.devices)
            self.metrics = Metrics(window_seconds=WINDOW)
            self._latencies.clear()
        self.metrics.feed(events)
        self.training.feed(events)
        self._latencies.extend((e.ts, e.get("latency")) for e in events
                               if e.kind == "request.finished" and e.get("latency") is not None)
        now = self.source.now()
        while self._latencies and self._latencies[0][0] < now - WINDOW:
            self._latencies.popleft()
        snap = self.metrics.snapshot(now)
        drawing = self._draw()
        colors = self._colors
        return DashboardView(
            status=status, plan=self._plan, drawing=drawing, colors=colors,
            devices=tuple(device_rows(self._plan, self.source.device_stats(), snap, colors)),
            partitions=tuple(partition_rows(self._plan, status.network, snap, colors)),
            queue=binned(((t, float(d)) for t, d in snap.queue_depth), now),
            throughput=padded([c for _, c in snap.throughput_series]),
            latency=binned(self._latencies, now, reduce=statistics.median),
            totals=Totals(snap.throughput, snap.requests_finished, snap.requests_failed,
                          snap.latency, snap.queue_depth[-1][1] if snap.queue_depth else 0),
            errors=tuple(snap.errors) + ((status.hint,) if status.hint else ()),
            bundle=self._bundle, training=self.training.view())

    def _draw(self) -> PlanDrawing | None:
        """The running plan's drawing, made again only when the plan changes."""
        plan = self.source.plan()
        if plan is not self._plan:
            self._plan = plan
            self._colors = device_colors(d.name for d in plan.devices) if plan else {}
            outline = self.source.outline() if plan is not None else None
            self._drawing = PlanDrawing.of(plan, outline, self._colors) \
                if plan is not None and outline is not None else None
            self._bundle = self._coloured(self.source.bundle() if plan is not None else None)
        return self._drawing

    def _coloured(self, info: BundleInfo | None) -> BundleInfo | None:
        if info is None:
            return None
        return replace(info, schedule=tuple(replace(r, color=self._colors.get(r.device,
                                                                                NO_COLOR))
                                            for r in info.schedule))

    # -- controls -----------------------------------------------------------------------

    def toggle_pause(self) -> None:
        self.source.toggle_pause()

    def faster(self) -> None:
        self.source.scale_load(FASTER)

    def slower(self) -> None:
        self.source.scale_load(1 / FASTER)

    def set_load(self, setting: LoadSetting) -> None:
        self.source.set_load(setting)

    def next_mode(self) -> str:
        return MODES[(MODES.index(self.status.mode) + 1) % len(MODES)] \
            if self.status.mode in MODES else MODES[0]

    def repartition(self, mode: str | None = None, devices: str | None = None,
                    model: str | Path | None = None) -> Plan:
        """Re-plan (and re-provision on new devices); the old plan keeps serving if the new
        one fails, and the error is raised."""
        return self.source.repartition(mode=mode, devices=devices, model=model)

    def change(self, model: str | Path, devices: str, mode: str, load: LoadSetting) -> str:
        """Re-partition if model, devices or mode differ from what runs, then set the load;
        says what it did. On an error the running plan keeps serving and it is raised."""
        now = self.source.state()
        message = "nothing to re-plan"
        bundle = is_bundle(model)  # planned when compiled: its mode is its own
        if (Path(model).resolve() != Path(now.model_path).resolve()
                or devices.strip() != now.devices or (mode != now.mode and not bundle)):
            plan = self.repartition(mode=None if bundle else mode, devices=devices.strip(),
                                    model=model)
            mode = plan.mode
            n = len(plan.partitions)
            message = (f"re-planned {Path(model).name}: {n} partition{'s' * (n != 1)} "
                       f"({mode}) on {devices.strip()}")
        self.set_load(load)
        return message

    def measured_times(self) -> dict[str, float]:
        """partition -> the median run time its runs showed, for each partition of the
        running plan that has run at least MIN_RUNS times."""
        snap = self.metrics.snapshot(self.source.now())
        network = self.source.state().network
        return {row.name: row.p50 for row in partition_rows(self._plan, network, snap, {})
                if row.runs >= MIN_RUNS}

    def replan_measured(self) -> Plan:
        """Re-plan from what the running plan measured: each partition's median run time
        feeds the next plan (`planning.live_costs`). The old plan keeps serving if the
        new one fails, and the error is raised."""
        seconds = self.measured_times()
        if not seconds:
            raise PrismError(f"no partition has run {MIN_RUNS} times yet: nothing measured "
                             f"to re-plan from")
        return self.source.replan_measured(seconds)

    def start_recording(self, path: str | Path) -> str:
        return self.source.start_recording(path)

    def stop_recording(self) -> str | None:
        return self.source.stop_recording()

    def stepper(self, mode: str | None = None) -> Stepper:
        """The partitioner's steps for what runs now (in `mode`, default the running one)."""
        return Stepper(self.source.partition_steps(mode or self.source.state().mode))

    def close(self) -> None:
        self.source.close()
