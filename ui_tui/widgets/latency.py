"""Per-partition latency table: count, the plan's estimate beside the measured p50, p95,
p99, last; the slowest row highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from app.dashboard import PartitionRow
from ui_tui.paint import chip_style, seconds

COLUMNS = ("partition", "device", "count", "est", "p50", "p95", "p99", "last")
WIDTHS = {"count": 7, "est": 8, "p50": 8, "p95": 8, "p99": 8, "last": 8}


def row_cells(row: PartitionRow) -> list[Text]:
    hot = "bold red" if row.slowest else ""
    figures = [seconds(v, row.runs) for v in (row.p50, row.p95, row.p99, row.last)]
    return [
        Text(f"{'▲' if row.slowest else ' '}{row.name}", style=hot),
        Text(f" {row.device} ", style=chip_style(row.color)),
        Text(f"{row.runs:,}", style=hot, justify="right"),
        Text(seconds(row.est_seconds, 1), style="dim", justify="right"),
        *(Text(f, style=hot, justify="right") for f in figures),
    ]


class LatencyTable(DataTable):
    """A DataTable that updates cells in place while the partitions stay the same."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=False, **kwargs)
        self.can_focus = False
        self._partitions: tuple[str, ...] | None = None

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name, width=WIDTHS.get(name))

    def show(self, rows: tuple[PartitionRow, ...]) -> None:
        partitions = tuple(r.name for r in rows)
        if partitions != self._partitions:
            self.clear()
            for r in rows:
                self.add_row(*row_cells(r), key=r.name)
            self._partitions = partitions
            return
        for r in rows:
            for column, cell in zip(COLUMNS, row_cells(r), strict=True):
                if self.get_cell(r.name, column) != cell:
                    self.update_cell(r.name, column, cell)

    def figures(self) -> dict[str, tuple[str, ...]]:
        """What the table shows, partition -> cells as plain text (for tests and checks)."""
        return {str(k.value): tuple(str(c) for c in self.get_row(k)) for k in self.rows}
