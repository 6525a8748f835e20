"""Queue depth and requests/s over the last minute as sparklines, with end-to-end latency."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from app.live import LiveView
from ui_tui.figures import current_queue_depth, queue_series, throughput_series
from ui_tui.paint import seconds, set_text


def depth_text(series: list[float], now: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("queue ")
    text.append(f"{now}", style="bold")
    text.append(f" now · max {max(series, default=0):.0f} in 60 s")
    return text


def rate_text(view: LiveView) -> Text:
    m = view.metrics
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{m.throughput:.1f}", style="bold")
    text.append(" req/s · ")
    text.append(f"{m.requests_finished:,}", style="bold")
    text.append(" done")
    if m.requests_failed:
        text.append(f" · {m.requests_failed:,} failed", style="bold red")
    text.append(f" · p50 {seconds(m.latency.p50, m.latency.count)}"
                f" p99 {seconds(m.latency.p99, m.latency.count)}")
    return text


class QueuePanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="queue-label")
        yield Sparkline([0.0], id="queue-spark")
        yield Static(id="rate")
        yield Sparkline([0.0], id="rate-spark")

    def show(self, view: LiveView) -> None:
        depth = queue_series(view)
        set_text(self.query_one("#queue-label", Static),
                 depth_text(depth, current_queue_depth(view)))
        set_text(self.query_one("#rate", Static), rate_text(view))
        for spark_id, series in (("#queue-spark", depth), ("#rate-spark", throughput_series(view))):
            spark = self.query_one(spark_id, Sparkline)
            if list(spark.data or []) != series:
                spark.data = series
