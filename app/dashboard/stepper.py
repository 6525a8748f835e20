"""The partition stepper: the partitioner's steps, one at a time, and what each shows."""

from __future__ import annotations

from dataclasses import dataclass

from app.dashboard.colors import NO_COLOR, UNASSIGNED, device_colors, inks
from app.dashboard.source import PartitionSteps
from runtime.partition import Step, replay
from runtime.partition.dot import Outline, graph_dot
from runtime.partition.steps import Replay


@dataclass(frozen=True)
class LegendEntry:
    partition: int
    device: str
    color: str
    nodes: int


@dataclass(frozen=True)
class StepView:
    """The state after one step: which partition (and device) each node has, the nodes the
    step is about (`focus`) and their neighbours, and a colour per assigned node."""

    index: int
    count: int
    step: Step
    state: Replay
    order: tuple[str, ...]  # the partitioner's node order (graph order before it picks one)
    focus: tuple[str, ...]
    neighbours: frozenset[str]
    node_colors: dict[str, str]
    legend: tuple[LegendEntry, ...]
    unassigned: int

    def color(self, node: str) -> str | None:
        return self.node_colors.get(node)


def step_focus(step: Step, state: Replay, order: tuple[str, ...]) -> tuple[str, ...]:
    """The nodes a step is about: those it assigns or moves; for an `open`, the next node
    still to place; for a `close`, the partition's last node; else the first in order."""
    if step.nodes and step.kind != "order":
        return step.nodes
    if step.kind == "open":
        return tuple(n for n in order if n not in state.assignment)[:1]
    if step.kind == "close":
        return tuple(n for n in order if state.assignment.get(n) == step.partition)[-1:]
    return order[:1]


class Stepper:
    """Walks a PartitionSteps; `view()` describes the current step."""

    def __init__(self, run: PartitionSteps) -> None:
        self.run = run
        self.steps: tuple[Step, ...] = run.steps
        self.outline: Outline = run.outline
        self.colors = device_colors(d.name for d in run.plan.devices)
        self.index = 0
        self._views: dict[int, StepView] = {}

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def mode(self) -> str:
        return self.run.mode

    def go(self, index: int) -> StepView:
        self.index = max(0, min(len(self.steps) - 1, index))
        return self.view()

    def end(self) -> StepView:
        return self.go(len(self.steps) - 1)

    def view(self) -> StepView:
        if self.index not in self._views:
            self._views[self.index] = self._describe(self.index)
        return self._views[self.index]

    def _describe(self, index: int) -> StepView:
        step, state = self.steps[index], replay(self.steps[: index + 1])
        order = state.order or tuple(self.outline.ops)
        focus = tuple(n for n in step_focus(step, state, order) if n in self.outline.ops)
        near = {m for n in focus for m in (*self.outline.predecessors[n],
                                           *self.outline.successors[n])} - set(focus)
        counts: dict[int, int] = {}
        for part in state.assignment.values():
            counts[part] = counts.get(part, 0) + 1
        node_colors = {n: self.colors.get(state.devices.get(p, ""), NO_COLOR)
                       for n, p in state.assignment.items()}
        legend = tuple(LegendEntry(p, d, self.colors.get(d, NO_COLOR), counts.get(p, 0))
                       for p, d in sorted(state.devices.items()))
        return StepView(index, len(self.steps), step, state, order, focus, frozenset(near),
                        node_colors, legend, len(self.outline.ops) - len(state.assignment))

    def dot(self, focus_only: bool = False) -> str:
        """Graphviz of the graph after the current step (only the step's nodes and their
        neighbours if `focus_only` and the step has any), each node in its device's ink."""
        view = self.view()
        shown = {*view.focus, *view.neighbours} if focus_only and view.focus else None
        return graph_dot(self.outline, inks(view.node_colors), UNASSIGNED,
                         {n: f"p{p}" for n, p in view.state.assignment.items()}, shown)
