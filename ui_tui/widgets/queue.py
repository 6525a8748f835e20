"""Queue depth and requests/s over the last minute as sparklines, with end-to-end latency."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from app.dashboard import DashboardView, Totals
from ui_tui.paint import seconds, set_text


def depth_text(view: DashboardView) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("queue ")
    text.append(f"{view.totals.queue_now}", style="bold")
    text.append(f" now · max {view.queue.peak:.0f} in {len(view.queue.values)} s")
    return text


def rate_text(t: Totals) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{t.throughput:.1f}", style="bold")
    text.append(" req/s · ")
    text.append(f"{t.finished:,}", style="bold")
    text.append(" done")
    if t.failed:
        text.append(f" · {t.failed:,} failed", style="bold red")
    text.append(f" · p50 {seconds(t.latency.p50, t.latency.count)}"
                f" p99 {seconds(t.latency.p99, t.latency.count)}")
    return text


class QueuePanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="queue-label")
        yield Sparkline([0.0], id="queue-spark")
        yield Static(id="rate")
        yield Sparkline([0.0], id="rate-spark")

    def show(self, view: DashboardView) -> None:
        set_text(self.query_one("#queue-label", Static), depth_text(view))
        set_text(self.query_one("#rate", Static), rate_text(view.totals))
        for spark_id, series in (("#queue-spark", view.queue), ("#rate-spark", view.throughput)):
            spark = self.query_one(spark_id, Sparkline)
            if list(spark.data or []) != list(series.values):
                spark.data = list(series.values)
