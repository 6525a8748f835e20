"""The dashboard: partition DAG, devices, per-partition latency, queue depth and errors."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from app.live import LiveView
from runtime.graph import Graph
from ui_tui.figures import NO_COLOR, device_rows, latency_rows
from ui_tui.messages import PartitionSelected
from ui_tui.widgets.dag import DagLayout, PartitionDag
from ui_tui.widgets.detail import PartitionDetail
from ui_tui.widgets.devices import DevicesPanel
from ui_tui.widgets.errors import ErrorsPanel
from ui_tui.widgets.latency import LatencyTable
from ui_tui.widgets.queue import QueuePanel
from ui_tui.widgets.status import StatusBar


def _panel(container: Vertical | VerticalScroll, title: str) -> Vertical | VerticalScroll:
    container.border_title = title
    container.add_class("panel")
    return container


class DashboardScreen(Screen):
    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.view: LiveView | None = None
        self.dag: DagLayout | None = None
        self._plan = None

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="top"):
            with _panel(Vertical(id="dag-panel"), "Partitions (↑↓ select)"):
                yield PartitionDag(id="dag")
            with _panel(VerticalScroll(id="devices-panel"), "Devices"):
                yield DevicesPanel(id="devices")
        with _panel(Vertical(id="latency-panel"), "Latency per partition (run time)"):
            yield LatencyTable(id="latency")
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

    def show(self, view: LiveView, graph: Graph | None, busy: str | None = None,
             replay: str | None = None) -> None:
        """Draw one LiveView. Called on the UI thread by the app's timer."""
        self.view = view
        self.query_one(StatusBar).show(view, busy, replay)
        if view.plan is not None and graph is not None and view.plan is not self._plan:
            self._plan, self.dag = view.plan, DagLayout.of(view.plan, graph)
        lat = latency_rows(view)
        if self.dag is not None:
            self.query_one(PartitionDag).show(self.dag, {r.partition: r for r in lat})
        self.query_one(DevicesPanel).show(device_rows(view))
        self.query_one(LatencyTable).show(lat)
        self.query_one(QueuePanel).show(view)
        self._show_detail()
        self.query_one("#errors-panel").set_class(bool(view.errors), "has-errors")
        self.query_one(ErrorsPanel).show(view.errors)

    def show_busy(self, busy: str | None, replay: str | None = None) -> None:
        if self.view is not None:
            self.query_one(StatusBar).show(self.view, busy, replay)

    def _show_detail(self) -> None:
        name = self.query_one(PartitionDag).selected
        detail = self.query_one(PartitionDetail)
        panel = self.query_one("#detail-panel")
        if self.dag is None or self.view is None or name not in self.dag.partitions:
            panel.border_title = "Selected partition"
            detail.show(None, NO_COLOR, None)
            return
        p = self.dag.partitions[name]
        lat = next((r for r in latency_rows(self.view) if r.partition == name), None)
        panel.border_title = f"Partition {name} on {p.device}"
        detail.show(p, self.dag.color(name), lat)

    def on_partition_selected(self, message: PartitionSelected) -> None:
        self._show_detail()
