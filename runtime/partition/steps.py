"""The partitioner's decisions, one record each, so a UI can replay a plan step by step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

STEP_KINDS = ("place", "order", "open", "assign", "close", "move", "skip", "split",
              "idle", "bound", "planned")
# split: a boundary left between a quantize/dequantize node and its op; idle: why a device
# was given no work; bound: the lower bound no split beats, and this plan's gap to it


@dataclass(frozen=True)
class Step:
    """One decision. `partition` is the index of the partition it opens or fills."""

    index: int
    kind: str
    reason: str
    partition: int | None = None
    device: str | None = None
    nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Replay:
    """The state after some steps: node -> partition index, partition index -> device."""

    assignment: dict[str, int]
    devices: dict[int, str]
    order: tuple[str, ...] = ()


def replay(steps: Iterable[Step]) -> Replay:
    state = Replay({}, {})
    for step in steps:
        if step.kind == "order":
            state.order = step.nodes
        elif step.partition is None:
            continue
        elif step.kind == "open" and step.device is not None:
            state.devices[step.partition] = step.device
        elif step.kind in ("assign", "move"):
            for node in step.nodes:
                state.assignment[node] = step.partition
    return state
