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

from app.dashboard import Stepper, StepView
from ui_tui.paint import chip_style, set_text
from ui_tui.widgets.node_graph import NodeGraph


def header_text(stepper: Stepper, view: StepView, busy: str | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" Prism stepper ", style="bold reverse")
    text.append(f" {stepper.run.model}", style="bold")
    text.append(f" · {stepper.mode} · {stepper.run.devices} · step ")
    text.append(f"{view.index + 1}/{view.count}", style="bold")
    text.append(f" {view.step.kind}")
    if busy:
        text.append(f" · {busy}…", style="italic")
    return text


def legend_text(view: StepView) -> Text:
    text = Text(no_wrap=False)
    for entry in view.legend:
        text.append(f" p{entry.partition} {entry.device} ", style=chip_style(entry.color))
        text.append(f" {entry.nodes} nodes  ")
    text.append(" unassigned ", style=chip_style(None))
    text.append(f" {view.unassigned} nodes")
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

    def __init__(self, stepper: Stepper) -> None:
        super().__init__(id="stepper")
        self.stepper = stepper
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

    def set_stepper(self, stepper: Stepper) -> None:
        """A re-run (new mode or devices): start again from the first step."""
        self.stepper = stepper
        self.redraw()

    def show_busy(self, busy: str | None) -> None:
        self.busy = busy
        self._show_header()

    def _show_header(self) -> None:
        set_text(self.query_one("#stepper-status", Static),
                 header_text(self.stepper, self.stepper.view(), self.busy))

    def redraw(self) -> None:
        view = self.stepper.view()
        self._show_header()
        panel = self.query_one("#reason-panel")
        panel.border_title = f"Step {view.index + 1} of {view.count}: {view.step.kind}"
        set_text(self.query_one("#reason", Static), Text(view.step.reason))
        set_text(self.query_one("#legend", Static), legend_text(view))
        self.query_one(NodeGraph).show(view, self.stepper.outline)

    def action_go(self, delta: int) -> None:
        self.stepper.go(self.stepper.index + delta)
        self.redraw()

    def action_first(self) -> None:
        self.stepper.go(0)
        self.redraw()

    def action_last(self) -> None:
        self.stepper.end()
        self.redraw()
