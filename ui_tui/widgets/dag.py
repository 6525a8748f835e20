"""The partition DAG: partitions as boxes by topological level, coloured by device, edges
labelled with the bytes each request sends along them. Arrow keys or a click select one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.events import Click
from textual.widget import Widget

from app.dashboard import PartitionRow
from app.dashboard.drawing import PlanDrawing
from runtime.partition import Partition
from runtime.units import human_bytes
from ui_tui.messages import PartitionSelected
from ui_tui.paint import chip_style, seconds

GAP = 2
BOX_MAX = 30


@dataclass
class Line:
    text: Text
    level: int
    regions: list[tuple[int, int, str]] = field(default_factory=list)  # x0, x1, partition


def _summary(p: Partition, lat: PartitionRow | None) -> str:
    n = len(p.nodes)
    figure = seconds(lat.p50, lat.runs) if lat else "–"
    return f"{n} node{'s' if n != 1 else ''} · p50 {figure}"


def _edge_line(layout: PlanDrawing, level: int) -> Line:
    """Edges arriving at `level`, each labelled src→dst with its bytes."""
    row = set(layout.levels[level])
    into = [e for e in layout.edges if e.dst in row]
    text = Text(no_wrap=True, overflow="ellipsis")
    above = layout.levels[level - 1]
    if len(into) == 1 and len(row) == 1 and len(above) == 1 and into[0].src == above[0]:
        e = into[0]
        text.append("  ↓ ", style=Style(color=layout.color(e.src), bold=True))
        text.append(human_bytes(e.bytes))
        if e.tensors > 1:
            text.append(f" ({e.tensors} tensors)", style="dim")
        return Line(text, level)
    text.append("  ↓", style="bold")
    for e in into:
        text.append(f" {e.src}→{e.dst} ", style=Style(color=layout.color(e.src), bold=True))
        text.append(human_bytes(e.bytes))
    if not into:
        text.append(" (no inputs from other partitions)", style="dim")
    return Line(text, level)


def _compact_row(layout: PlanDrawing, level: int, latency: dict[str, PartitionRow],
                 selected: str | None) -> Line:
    text = Text(no_wrap=True, overflow="ellipsis")
    line = Line(text, level)
    for name in layout.levels[level]:
        p = layout.partitions[name]
        text.append("▶" if name == selected else " ", style="bold")
        x0 = len(text)
        text.append(f" {name} {p.device} ", style=chip_style(layout.color(name), bold=True,
                                                             selected=name == selected))
        text.append(f" {_summary(p, latency.get(name))}", style="bold" if name == selected
                    else "")
        line.regions.append((x0 - 1, len(text), name))
        text.append(" " * GAP)
    return line


def _boxed_rows(layout: PlanDrawing, level: int, latency: dict[str, PartitionRow],
                selected: str | None, width: int) -> list[Line]:
    names = layout.levels[level]
    w = max(12, min(BOX_MAX, (width - GAP * (len(names) - 1)) // len(names)))
    lines = [Line(Text(no_wrap=True, overflow="ellipsis"), level) for _ in range(3)]
    x = 0
    for name in names:
        p = layout.partitions[name]
        color = layout.color(name)
        sel = name == selected
        tl, tr, bl, br, h, v = "┏┓┗┛━┃" if sel else "╭╮╰╯─│"
        edge = Style(color=color, bold=sel)
        title = f" {name} {p.device} "[: w - 3]
        top, mid, bottom = (ln.text for ln in lines)
        top.append(tl + h, style=edge)
        top.append(title, style=chip_style(color, bold=True))
        top.append(h * (w - 3 - len(title)) + tr, style=edge)
        body = _summary(p, latency.get(name))[: w - 4]
        mid.append(v, style=edge)
        mid.append(f" {body:<{w - 3}}", style="bold" if sel else "")
        mid.append(v, style=edge)
        bottom.append(bl + h * (w - 2) + br, style=edge)
        for ln in lines:
            ln.regions.append((x, x + w, name))
            ln.text.append(" " * GAP)
        x += w + GAP
    return lines


def dag_lines(layout: PlanDrawing, latency: dict[str, PartitionRow], selected: str | None,
              width: int, height: int) -> list[Line]:
    """Boxes when they fit the height, else one-line chips; edges between levels."""
    n = len(layout.levels)
    boxed = n * 3 + max(0, n - 1) <= height
    lines: list[Line] = []
    for level in range(n):
        if level:
            lines.append(_edge_line(layout, level))
        if boxed:
            lines.extend(_boxed_rows(layout, level, latency, selected, width))
        else:
            lines.append(_compact_row(layout, level, latency, selected))
    return lines


def visible_window(lines: list[Line], height: int, level: int) -> list[Line]:
    """At most `height` lines, keeping the rows of `level` in view."""
    if len(lines) <= height:
        return lines
    rows = [i for i, ln in enumerate(lines) if ln.level == level and ln.regions]
    first = max(0, min(rows[0] - (height - len(rows)) // 2, len(lines) - height))
    return lines[first:first + height]


class PartitionDag(Widget, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("down,right,j", "move(1)", "Next partition", show=False),
        Binding("up,left,k", "move(-1)", "Previous partition", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dag: PlanDrawing | None = None
        self.latency: dict[str, PartitionRow] = {}
        self.selected: str | None = None
        self._shown: list[Line] = []

    def show(self, layout: PlanDrawing, latency: dict[str, PartitionRow]) -> None:
        changed = layout is not self.dag or latency != self.latency
        self.dag, self.latency = layout, latency
        if self.selected not in layout.partitions:
            self.select(layout.order[0] if layout.order else None)
        elif changed:
            self.refresh()

    def select(self, name: str | None) -> None:
        self.selected = name
        self.refresh()
        if name is not None:
            self.post_message(PartitionSelected(name))

    def action_move(self, step: int) -> None:
        if self.dag is None or not self.dag.order:
            return
        order = self.dag.order
        i = order.index(self.selected) if self.selected in order else -1
        self.select(order[(i + step) % len(order)])

    def on_click(self, event: Click) -> None:
        y, x = event.y, event.x
        if 0 <= y < len(self._shown):
            for x0, x1, name in self._shown[y].regions:
                if x0 <= x < x1:
                    self.select(name)
                    return

    def render(self) -> Text:
        if self.dag is None:
            return Text("no plan", style="dim")
        width, height = self.content_size.width, self.content_size.height
        lines = dag_lines(self.dag, self.latency, self.selected, width, height)
        level = next((i for i, row in enumerate(self.dag.levels) if self.selected in row), 0)
        self._shown = visible_window(lines, max(1, height), level)
        return Text("\n", no_wrap=True, overflow="ellipsis").join(ln.text for ln in self._shown)
