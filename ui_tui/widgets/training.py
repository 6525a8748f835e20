"""A training run: where it is and its loss (a line and a sparkline of every step's), and
per device a timeline of the latest step, each cell what the device ran then: a forward
(the micro-batch's last digit on the device's colour), a backward (the same, reversed),
the update (U), or nothing (·, the bubble)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from app.dashboard import TimelineBar, TrainingView
from app.dashboard.colors import NO_COLOR, tint
from ui_tui.paint import ink_on, seconds, set_text

LABEL_WIDTH = 8


def headline(view: TrainingView) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    state = "failed" if view.error else "done" if view.finished else "training"
    text.append(f"{state} ", style="bold red" if view.error else "bold")
    text.append(f"epoch {view.epoch}/{view.epochs} · step {view.steps_done}/{view.steps} · "
                f"{len(view.devices)} stages, {view.schedule}, {view.micro_batches} micro")
    if view.last is not None:
        last = view.last
        text.append(" · loss ")
        text.append(f"{last.loss:.4f}", style="bold")
        text.append(f" · step {seconds(last.seconds)} (ideal {seconds(last.ideal_seconds)})"
                    f" · bubble {last.bubble:.0%}")
    if view.error:
        text.append(f"\n{view.error}", style="red")
    return text


def _cell(bar: TimelineBar, color: str) -> tuple[str, Style]:
    if bar.phase == "update":
        return "U", Style(color="#000000", bgcolor="#bbbbbb", bold=True)
    digit = str(bar.micro_batch % 10)
    if bar.phase == "forward":
        return digit, Style(color=ink_on(color), bgcolor=color)
    light = tint(color, 0.55)
    return digit, Style(color=ink_on(light), bgcolor=light, bold=True)


def timeline_text(view: TrainingView, colors: dict[str, str], width: int) -> Text:
    """One row per device over the latest step's length, `width` cells wide."""
    text = Text(no_wrap=True)
    if not view.timeline:
        text.append("no step has finished yet", style="dim")
        return text
    span = max(b.end for b in view.timeline) or 1.0
    cells = max(10, width - LABEL_WIDTH - 1)
    for i, device in enumerate(view.devices):
        color = colors.get(device, NO_COLOR)
        row: list[tuple[str, Style]] = [("·", Style(dim=True))] * cells
        for bar in (b for b in view.timeline if b.device == device and b.seconds > 0):
            first = min(cells - 1, int(bar.start / span * cells))
            last = max(first + 1, min(cells, round(bar.end / span * cells)))
            for c in range(first, last):
                row[c] = _cell(bar, color)
        if i:
            text.append("\n")
        text.append(f"{device[:LABEL_WIDTH - 1]:<{LABEL_WIDTH}}",
                    style=Style(color=ink_on(color), bgcolor=color))
        text.append(" ")
        for char, style in row:
            text.append(char, style=style)
    return text


class TrainingPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="training-headline")
        yield Sparkline([0.0], id="loss-spark")
        yield Static(id="timeline")

    def show(self, view: TrainingView, colors: dict[str, str]) -> None:
        set_text(self.query_one("#training-headline", Static), headline(view))
        spark = self.query_one("#loss-spark", Sparkline)
        losses = list(view.losses) or [0.0]
        if list(spark.data or []) != losses:
            spark.data = losses
        width = self.size.width or 80
        set_text(self.query_one("#timeline", Static), timeline_text(view, colors, width))
