"""Numbering steps as a mode yields them, and running a step generator to its result."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from runtime.partition.steps import Step

T = TypeVar("T")
Steps = Generator[Step, None, T]


class Recorder:
    def __init__(self) -> None:
        self.count = 0

    def step(self, kind: str, reason: str, partition: int | None = None,
             device: str | None = None, nodes: tuple[str, ...] = ()) -> Step:
        self.count += 1
        return Step(self.count - 1, kind, reason, partition, device, nodes)


def finish(steps: Steps[T]) -> T:
    """Run a step generator to the end and return what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value



def tap(steps: Steps[T], see: Callable[[Step], None]) -> Steps[T]:
    """The same steps, each shown to `see` on its way through; returns what `steps` returns."""
    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            return done.value
        see(step)
        yield step
