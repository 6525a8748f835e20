"""A bundle's schedule table: one row per partition, its device, what it reads and writes
and the rows it waits for."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from app.dashboard import ScheduleRow
from ui_tui.paint import chip_style

COLUMNS = ("partition", "device", "reads", "writes", "after")
SHOWN = 3  # tensor names shown per cell before "+N"


def names(values: tuple[str, ...], limit: int = SHOWN) -> str:
    shown = ", ".join(values[:limit])
    extra = len(values) - limit
    return (shown + (f" +{extra}" if extra > 0 else "")) or "–"


def schedule_cells(row: ScheduleRow) -> list[Text]:
    return [Text(row.partition), Text(f" {row.device} ", style=chip_style(row.color)),
            Text(names(row.reads)), Text(names(row.writes)), Text(names(row.after))]


class ScheduleTable(DataTable):
    """Filled once per schedule (it changes only with the plan)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=False, **kwargs)
        self.can_focus = False
        self.rows_shown: tuple[ScheduleRow, ...] = ()

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)

    def show(self, rows: tuple[ScheduleRow, ...]) -> None:
        if rows == self.rows_shown:
            return
        self.clear()
        for r in rows:
            self.add_row(*schedule_cells(r), key=r.partition)
        self.rows_shown = rows
