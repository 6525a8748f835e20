"""The stepper's node-level view: the nodes of the current step, their neighbours and the
nodes around them in the partitioner's order, each coloured by the device of the partition
it has been given so far (uncoloured while unassigned), with the edges into each node."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from rich.text import Text
from textual.widget import Widget

from app.live import Stepper
from runtime.graph import Graph
from runtime.partition.steps import Replay
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


def node_order(stepper: Stepper, state: Replay) -> list[str]:
    return list(state.order) or [n.name for n in stepper.graph.nodes]


def step_focus(stepper: Stepper, state: Replay, order: list[str]) -> list[str]:
    """The nodes the current step is about: those it assigns or moves; for an `open`, the
    next node still to place; for a `close`, the partition's last node."""
    step = stepper.step
    if step.nodes and step.kind != "order":
        return list(step.nodes)
    if step.kind == "open":
        nxt = next((n for n in order if n not in state.assignment), None)
        return [nxt] if nxt else []
    if step.kind == "close":
        members = [n for n in order if state.assignment.get(n) == step.partition]
        return members[-1:]
    return order[:1]


def color_of(node: str, state: Replay, colors: dict[str, str]) -> str | None:
    part = state.assignment.get(node)
    if part is None:
        return None
    return colors.get(state.devices.get(part, ""))


def _gaps(positions: list[int]) -> int:
    return sum(1 for a, b in pairwise(positions) if b > a + 1)


def node_rows(stepper: Stepper, colors: dict[str, str], height: int) -> list[NodeRow | None]:
    """Rows for at most `height` lines; None marks a gap in the order."""
    graph: Graph = stepper.graph
    state = stepper.state()
    order = node_order(stepper, state)
    pos = {n: i for i, n in enumerate(order)}
    focus = [n for n in step_focus(stepper, state, order) if n in pos]
    neighbours = {m for n in focus for m in (*graph.dag.predecessors(n),
                                             *graph.dag.successors(n))} - set(focus)
    required = sorted(set(focus) | neighbours, key=pos.__getitem__)[: max(1, height)]
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
        part = state.assignment.get(n)
        device = state.devices.get(part) if part is not None else None
        role = FOCUS if n in focus else NEIGHBOUR if n in neighbours else CONTEXT
        rows.append(NodeRow(n, graph.node(n).op_type, part, device, color_of(n, state, colors),
                            role, tuple(graph.dag.predecessors(n))))
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
        self.stepper: Stepper | None = None
        self.device_colors: dict[str, str] = {}
        self.rows: list[NodeRow | None] = []
        self.text = Text()

    def show(self, stepper: Stepper, colors: dict[str, str]) -> None:
        self.stepper, self.device_colors = stepper, colors
        self.refresh()

    def render(self) -> Text:
        if self.stepper is None:
            return Text("no steps", style="dim")
        self.rows = node_rows(self.stepper, self.device_colors, max(1, self.content_size.height))
        self.text = rows_text(self.rows, self.content_size.width)
        return self.text
