"""The stepper's node-level view: the nodes of the current step, their neighbours and the
nodes around them in the partitioner's order, each coloured by the device of the partition
it has been given so far (uncoloured while unassigned), with the edges into each node."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from rich.text import Text
from textual.widget import Widget

from app.dashboard import StepView
from runtime.partition.dot import Outline
from ui_tui.paint import chip_style

FOCUS, NEIGHBOUR, CONTEXT = "focus", "neighbour", "context"
MARKS = {FOCUS: "▶", NEIGHBOUR: "·", CONTEXT: " "}


@dataclass(frozen=True)
class NodeRow:
    node: str
    op: str
    partition: int | None
    device: str | None
    color: str | None
    role: str
    preds: tuple[str, ...]


def _gaps(positions: list[int]) -> int:
    return sum(1 for a, b in pairwise(positions) if b > a + 1)


def node_rows(view: StepView, outline: Outline, height: int) -> list[NodeRow | None]:
    """Rows for at most `height` lines: the step's nodes and their neighbours, then as many
    nodes around them in order as fit; None marks a gap in the order."""
    order = view.order
    pos = {n: i for i, n in enumerate(order)}
    focus = [n for n in view.focus if n in pos]
    required = sorted(set(focus) | (view.neighbours & pos.keys()),
                      key=pos.__getitem__)[: max(1, height)]
    centre = pos[focus[0]] if focus else 0
    shown = set(required)
    for radius in range(len(order)):
        window = {order[i] for i in range(max(0, centre - radius),
                                          min(len(order), centre + radius + 1))}
        trial = sorted(shown | window, key=pos.__getitem__)
        if len(trial) + _gaps([pos[n] for n in trial]) > height:
            break
        shown |= window
        if len(window) == len(order):
            break
    rows: list[NodeRow | None] = []
    last = None
    for n in sorted(shown, key=pos.__getitem__):
        if last is not None and pos[n] > last + 1:
            rows.append(None)
        last = pos[n]
        part = view.state.assignment.get(n)
        device = view.state.devices.get(part) if part is not None else None
        role = FOCUS if n in focus else NEIGHBOUR if n in view.neighbours else CONTEXT
        rows.append(NodeRow(n, outline.ops[n], part, device, view.color(n), role,
                            outline.predecessors[n]))
    return rows


def rows_text(rows: list[NodeRow | None], width: int) -> Text:
    name_w = min(max((len(r.node) for r in rows if r), default=8), max(12, width // 3))
    op_w = max((len(r.op) for r in rows if r), default=4)
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, r in enumerate(rows):
        if i:
            text.append("\n")
        if r is None:
            text.append("  ⋮", style="dim")
            continue
        text.append(f"{MARKS[r.role]} ", style="bold")
        text.append(f" {r.node[:name_w]:<{name_w}} ", style=chip_style(r.color,
                                                                      bold=r.role == FOCUS))
        text.append(f" {r.op:<{op_w}} ")
        where = f"p{r.partition} {r.device}" if r.partition is not None else "unassigned"
        text.append(f"{where:<12}", style="bold" if r.partition is not None else "dim")
        if r.preds:
            text.append(" ← " + ", ".join(r.preds), style="dim")
    return text


class NodeGraph(Widget):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shown: tuple[StepView, Outline] | None = None
        self.rows: list[NodeRow | None] = []
        self.text = Text()

    def show(self, view: StepView, outline: Outline) -> None:
        self.shown = (view, outline)
        self.refresh()

    def render(self) -> Text:
        if self.shown is None:
            return Text("no steps", style="dim")
        self.rows = node_rows(*self.shown, max(1, self.content_size.height))
        self.text = rows_text(self.rows, self.content_size.width)
        return self.text
