"""Devices panel: memory used/total as a bar, utilisation, queue length, runs served."""

from __future__ import annotations

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from app.dashboard import DeviceRow
from runtime.units import human_bytes
from ui_tui.paint import bar, chip_style


def device_lines(rows: tuple[DeviceRow, ...], width: int) -> Text:
    out = Text(no_wrap=True, overflow="ellipsis")
    name_w = max((len(r.name) for r in rows), default=4)
    for i, r in enumerate(rows):
        if i:
            out.append("\n")
        mem = f" {human_bytes(r.used_bytes)}/{human_bytes(r.total_bytes)}"
        out.append(f" {r.name:<{name_w}} ", style=chip_style(r.color, bold=True))
        out.append(" ")
        out.append_text(bar(r.memory_share, max(4, width - name_w - 3 - len(mem)), r.color))
        out.append(mem)
        out.append("\n")
        out.append(f" {r.where:<{name_w}}  ", style="dim")
        if r.health != "ok":
            out.append(f"{r.health.upper()}  ", style="bold red")
        out.append("util ")
        out.append(f"{r.utilisation:4.0%}", style="bold")
        out.append("  queue ")
        out.append(f"{r.queue_length:<3}", style="bold")
        out.append(" runs ")
        out.append(f"{r.runs:,}", style="bold")
    return out


class DevicesPanel(Widget):
    """Redraws from the rows it was last given; sized to its region."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: tuple[DeviceRow, ...] = ()

    def show(self, rows: tuple[DeviceRow, ...]) -> None:
        if rows != self.rows:
            resized = len(rows) != len(self.rows)
            self.rows = rows
            self.refresh(layout=resized)

    def render(self) -> Text:
        return device_lines(self.rows, self.content_size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, 2 * len(self.rows))
