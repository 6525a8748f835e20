"""The dashboard: partition DAG, devices, per-partition latency, queue depth and errors;
for a network from a bundle, its schedule table; for a training run, its loss and step
timeline in place of the serving panels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from app.dashboard import DashboardView
from app.dashboard.colors import NO_COLOR
from ui_tui.messages import PartitionSelected
from ui_tui.widgets.dag import PartitionDag
from ui_tui.widgets.detail import PartitionDetail
from ui_tui.widgets.devices import DevicesPanel
from ui_tui.widgets.errors import ErrorsPanel
from ui_tui.widgets.latency import LatencyTable
from ui_tui.widgets.queue import QueuePanel
from ui_tui.widgets.schedule import ScheduleTable
from ui_tui.widgets.status import StatusBar
from ui_tui.widgets.training import TrainingPanel


def _panel(container: Vertical | VerticalScroll, title: str) -> Vertical | VerticalScroll:
    container.border_title = title
    container.add_class("panel")
    return container


class DashboardScreen(Screen):
    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.view: DashboardView | None = None

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="top"):
            with _panel(Vertical(id="dag-panel"), "Partitions (↑↓ select)"):
                yield PartitionDag(id="dag")
            with _panel(VerticalScroll(id="devices-panel"), "Devices"):
                yield DevicesPanel(id="devices")
        with _panel(Vertical(id="training-panel"), "Training · loss per step · the latest "
                    "step per device: forwards, backwards (reversed), U update, · idle"):
            yield TrainingPanel(id="training")
        with _panel(Vertical(id="latency-panel"), "Latency per partition (run time)"):
            yield LatencyTable(id="latency")
        with _panel(VerticalScroll(id="schedule-panel"), "Schedule"):
            yield ScheduleTable(id="schedule")
        with Horizontal(id="bottom"):
            with _panel(Vertical(id="queue-panel"), "Queue depth · requests/s"):
                yield QueuePanel(id="queue")
            with _panel(VerticalScroll(id="detail-panel"), "Selected partition"):
                yield PartitionDetail(id="detail")
        with _panel(VerticalScroll(id="errors-panel"), "Recent errors"):
            yield ErrorsPanel(id="errors")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(PartitionDag).focus()

    def show(self, view: DashboardView, busy: str | None = None) -> None:
        """Draw one DashboardView. Called on the UI thread by the app's timer."""
        self.view = view
        self.query_one(StatusBar).show(view.status, busy)
        if view.drawing is not None:
            self.query_one(PartitionDag).show(view.drawing,
                                              {r.name: r for r in view.partitions})
        self.query_one(DevicesPanel).show(view.devices)
        self.set_class(view.training is not None, "training")
        if view.training is not None:
            self.query_one(TrainingPanel).show(view.training, view.colors)
        self.query_one(LatencyTable).show(view.partitions)
        self._show_schedule(view)
        self.query_one(QueuePanel).show(view)
        self._show_detail()
        self.query_one("#errors-panel").set_class(bool(view.errors), "has-errors")
        self.query_one(ErrorsPanel).show(view.errors)

    def _show_schedule(self, view: DashboardView) -> None:
        """Only for a network from a bundle: its schedule table, titled with the file."""
        panel = self.query_one("#schedule-panel")
        panel.set_class(view.bundle is not None, "from-bundle")
        if view.bundle is not None:
            panel.border_title = (f"Schedule · {view.bundle.name} (compiled ahead of time "
                                  f"with {view.bundle.made_with})")
            self.query_one(ScheduleTable).show(view.bundle.schedule)

    def show_busy(self, busy: str | None) -> None:
        if self.view is not None:
            self.query_one(StatusBar).show(self.view.status, busy)

    def _show_detail(self) -> None:
        name = self.query_one(PartitionDag).selected
        detail = self.query_one(PartitionDetail)
        panel = self.query_one("#detail-panel")
        drawing = self.view.drawing if self.view is not None else None
        if self.view is None or drawing is None or name not in drawing.partitions:
            panel.border_title = "Selected partition"
            detail.show(None, NO_COLOR, None)
            return
        p = drawing.partitions[name]
        row = next((r for r in self.view.partitions if r.name == name), None)
        panel.border_title = f"Partition {name} on {p.device}"
        detail.show(p, drawing.color(name), row)

    def on_partition_selected(self, message: PartitionSelected) -> None:
        self._show_detail()
