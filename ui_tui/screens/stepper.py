"""The partition stepper: the partitioner's decisions one at a time, with the nodes around
each coloured by the partition (device) they have so far and the reason in words."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.live import Stepper
from runtime.partition.steps import Replay
from ui_tui.paint import chip_style, set_text
from ui_tui.widgets.node_graph import NodeGraph


def header_text(stepper: Stepper, spec: str, busy: str | None) -> Text:
    step = stepper.step
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" Prism stepper ", style="bold reverse")
    text.append(f" {stepper.graph.name.split('#')[0]}", style="bold")
    text.append(f" · {stepper.mode} · {spec} · step ")
    text.append(f"{stepper.index + 1}/{len(stepper)}", style="bold")
    text.append(f" {step.kind}")
    if busy:
        text.append(f" · {busy}…", style="italic")
    return text


def legend_text(stepper: Stepper, state: Replay, colors: dict[str, str]) -> Text:
    text = Text(no_wrap=False)
    counts: dict[int, int] = {}
    for part in state.assignment.values():
        counts[part] = counts.get(part, 0) + 1
    for part, device in sorted(state.devices.items()):
        text.append(f" p{part} {device} ", style=chip_style(colors.get(device)))
        text.append(f" {counts.get(part, 0)} nodes  ")
    unplaced = len(stepper.graph.nodes) - len(state.assignment)
    text.append(" unassigned ", style=chip_style(None))
    text.append(f" {unplaced} nodes")
    return text


class StepperScreen(Screen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right,n", "go(1)", "Next", key_display="→"),
        Binding("left,b", "go(-1)", "Prev", key_display="←"),
        Binding("pagedown", "go(10)", "+10 steps", show=False),
        Binding("pageup", "go(-10)", "-10 steps", show=False),
        Binding("home,g", "first", "First", key_display="home"),
        Binding("end,G", "last", "Last", key_display="end"),
        Binding("escape,s", "app.pop_screen", "Close", key_display="esc"),
    ]

    def __init__(self, stepper: Stepper, spec: str) -> None:
        super().__init__(id="stepper")
        self.stepper, self.spec = stepper, spec
        self.busy: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="stepper-status")
        with Vertical(id="reason-panel", classes="panel"):
            yield Static(id="reason")
        yield Static(id="legend")
        with Vertical(id="graph-panel", classes="panel") as panel:
            panel.border_title = "Nodes: ▶ this step · its neighbours   (pgup/pgdn: 10 steps)"
            yield NodeGraph(id="node-graph")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.redraw()

    @property
    def device_colors(self) -> dict[str, str]:
        return self.stepper.plan.colors()

    def set_stepper(self, stepper: Stepper, spec: str) -> None:
        """A re-run (new mode or devices): start again from the first step."""
        self.stepper, self.spec = stepper, spec
        self.redraw()

    def show_busy(self, busy: str | None) -> None:
        self.busy = busy
        self._show_header()

    def _show_header(self) -> None:
        set_text(self.query_one("#stepper-status", Static),
                 header_text(self.stepper, self.spec, self.busy))

    def redraw(self) -> None:
        stepper = self.stepper
        step, state, colors = stepper.step, stepper.state(), self.device_colors
        self._show_header()
        panel = self.query_one("#reason-panel")
        panel.border_title = f"Step {stepper.index + 1} of {len(stepper)}: {step.kind}"
        set_text(self.query_one("#reason", Static), Text(step.reason))
        set_text(self.query_one("#legend", Static), legend_text(stepper, state, colors))
        self.query_one(NodeGraph).show(stepper, colors)

    def action_go(self, delta: int) -> None:
        self.stepper.go(self.stepper.index + delta)
        self.redraw()

    def action_first(self) -> None:
        self.stepper.go(0)
        self.redraw()

    def action_last(self) -> None:
        self.stepper.end()
        self.redraw()
