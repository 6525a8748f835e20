"""Memory plan per device: where every activation tensor lives in the device's arena.

After TVM's graph memory planner and ONNX Runtime's allocation planner. A device runs
its partitions one at a time, in plan order, so its partitions' steps lie end to end on
one timeline (step = a node run on that device). Each activation tensor (weights
excluded) that a partition on the device reads or writes gets one entry per device:

- its lifetime `[start, end]` (both ends included) is the union of its lifetimes in the
  device's partitions (`live_intervals`: an input from outside is live from its
  partition's first step; a tensor made here lives from its producer to its last reader
  here, or to the end of its partition if something elsewhere reads it or it is a graph
  output). A tensor crosses into a device once, so one read by two partitions on the
  device stays resident from the first to the last; so does a tensor made by one
  partition and read by a later one on the same device.
- its `offset` in the arena, by first fit: one tensor at a time, each at the lowest
  offset (a multiple of `alignment`) where it overlaps no already placed tensor live at
  the same time. Tensors whose lifetimes do not overlap may share bytes: that is the
  reuse. The order tensors are placed in matters, so a few are tried (largest first,
  as TVM and Glow do; longest lived first; earliest first, as ONNX Runtime does; largest
  size x lifetime first; ties by name) and the smallest arena kept. Placing is
  deterministic: the same plan always gives the same offsets.
- its `storage_id`: one id per distinct `(offset, size)` block, numbered by offset then
  size. Tensors with the same id occupy exactly the same bytes (at different times);
  tensors with different ids may still share some bytes at different times.

`peak_bytes` is the most bytes live at any step; `arena_bytes` (the largest
`offset + size`) is what the plan needs, never less than the peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from runtime.devices.config import DeviceConfig
from runtime.graph import Graph
from runtime.partition.liveness import live_intervals
from runtime.precision import held_bytes
from runtime.request_memory import live_bytes


class Placed(Protocol):
    """What a memory plan reads of a partition (plan.py builds on this module, so it
    names the shape rather than import `Partition`)."""

    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...


class PlanLike(Protocol):
    @property
    def partitions(self) -> Sequence[Placed]: ...
    @property
    def devices(self) -> Sequence[DeviceConfig]: ...


@dataclass(frozen=True)
class MemoryEntry:
    """One activation tensor on one device: where it sits and when it is live."""

    tensor: str
    partition: str  # the first of the device's partitions that holds it
    storage_id: int
    offset: int
    size: int
    start: int  # first step on the device's timeline it occupies memory
    end: int  # last step (included)
    partitions: tuple[str, ...] = ()  # every partition on the device that reads or writes it

    def overlaps_in_time(self, other: MemoryEntry) -> bool:
        return self.start <= other.end and other.start <= self.end

    def overlaps_in_memory(self, other: MemoryEntry) -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass(frozen=True)
class DeviceMemoryPlan:
    device: str
    entries: list[MemoryEntry]
    peak_bytes: int  # the most bytes live at any one step
    arena_bytes: int  # max(offset + size): the arena the plan needs
    steps: int = 0  # length of the device's timeline (nodes it runs per request)
    partition_steps: dict[str, tuple[int, int]] = field(default_factory=dict)  # [first, last]

    @property
    def storage_blocks(self) -> int:
        return len({e.storage_id for e in self.entries})

    @property
    def total_tensor_bytes(self) -> int:
        """What the tensors would need with no reuse at all."""
        return sum(e.size for e in self.entries)

    def entry(self, tensor: str) -> MemoryEntry:
        return next(e for e in self.entries if e.tensor == tensor)

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "arena_bytes": self.arena_bytes,
            "steps": self.steps,
            "partition_steps": {p: list(s) for p, s in self.partition_steps.items()},
            "entries": [{**asdict(e), "partitions": list(e.partitions)} for e in self.entries],
        }


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


# Orders to place tensors in; the plan keeps the one with the smallest arena.
_ORDERS = {
    "largest first": lambda size, start, end: (-size, start),  # TVM / Glow
    "longest first": lambda size, start, end: (start - end, -size, start),
    "earliest first": lambda size, start, end: (start, -size),  # ONNX Runtime-like
    "largest area first": lambda size, start, end: (-size * (end - start + 1), start),
}


def _first_fit(spans: dict[str, tuple[int, int, int]], alignment: int, order
               ) -> dict[str, int]:
    """tensor -> offset: in `order`, each at the lowest aligned offset that collides with
    no placed tensor live at the same time."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[str, int] = {}
    for tensor in sorted(spans, key=lambda t: (*order(*spans[t]), t)):
        size, start, end = spans[tensor]
        busy = sorted((o, o + s) for o, s, a, b in placed if s and a <= end and start <= b)
        offset = 0
        if size:
            for lo, hi in busy:
                if offset + size <= lo:
                    break
                offset = max(offset, _align(hi, alignment))
        offsets[tensor] = offset
        placed.append((offset, size, start, end))
    return offsets


def _assign_offsets(spans: dict[str, tuple[int, int, int]], alignment: int) -> dict[str, int]:
    """The first-fit placement with the smallest arena over a few orders (first wins ties)."""
    floor = _peak(spans, 1 + max((end for _, _, end in spans.values()), default=-1))
    best: tuple[int, dict[str, int]] = (-1, {})
    for order in _ORDERS.values():
        offsets = _first_fit(spans, alignment, order)
        arena = max((offsets[t] + spans[t][0] for t in spans), default=0)
        if best[0] < 0 or arena < best[0]:
            best = (arena, offsets)
        if arena <= floor:
            break  # no arena is smaller than the peak
    return best[1]


def _peak(spans: dict[str, tuple[int, int, int]], steps: int) -> int:
    return int(live_bytes([(start, end) for _, start, end in spans.values()],
                          [size for size, _, _ in spans.values()], steps).max(initial=0))


def _timeline(partitions: Sequence[Placed], graph: Graph, device: str):
    """The device's partitions end to end: tensor -> (size, first, last step), the
    partitions holding each tensor, each partition's steps, and the number of steps."""
    spans: dict[str, list[int]] = {}  # tensor -> [start, end]
    holders: dict[str, list[str]] = {}
    bounds: dict[str, tuple[int, int]] = {}
    base = 0
    for part in partitions:
        if part.device != device or not part.nodes:
            continue
        nodes = [graph.node(n) for n in part.nodes]
        bounds[part.name] = (base, base + len(nodes) - 1)
        for tensor, (start, end) in live_intervals(graph, nodes).items():
            span = spans.setdefault(tensor, [base + start, base + end])
            span[0] = min(span[0], base + start)
            span[1] = max(span[1], base + end)
            holders.setdefault(tensor, []).append(part.name)
        base += len(nodes)
    sized = {t: (held_bytes(graph, t), s, e) for t, (s, e) in spans.items()}
    return sized, holders, bounds, base


def device_peak_bytes(partitions: Sequence[Placed], graph: Graph, device: str) -> int:
    """The most activation bytes live at once on the device (no offsets computed)."""
    sized, _, _, steps = _timeline(partitions, graph, device)
    return _peak(sized, steps)


def device_memory_plan(plan: PlanLike, graph: Graph, device: str, *, alignment: int = 1
                       ) -> DeviceMemoryPlan:
    """The memory plan of one device (see the module's docstring)."""
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    sized, holders, bounds, base = _timeline(plan.partitions, graph, device)
    offsets = _assign_offsets(sized, alignment)
    blocks = sorted({(offsets[t], sized[t][0]) for t in sized})
    storage = {block: i for i, block in enumerate(blocks)}
    entries = [MemoryEntry(tensor=t, partition=holders[t][0],
                           storage_id=storage[offsets[t], size], offset=offsets[t], size=size,
                           start=start, end=end, partitions=tuple(holders[t]))
               for t, (size, start, end) in sorted(sized.items(),
                                                   key=lambda kv: (kv[1][1], kv[1][2], kv[0]))]
    arena = max((e.offset + e.size for e in entries), default=0)
    return DeviceMemoryPlan(device=device, entries=entries, peak_bytes=_peak(sized, base),
                            arena_bytes=arena, steps=base, partition_steps=bounds)


def memory_plans(plan: PlanLike, graph: Graph, *, alignment: int = 1
                 ) -> dict[str, DeviceMemoryPlan]:
    """device name -> its memory plan, for every device in the plan (idle ones empty)."""
    return {d.name: device_memory_plan(plan, graph, d.name, alignment=alignment)
            for d in plan.devices}


def memory_plans_dict(plans: dict[str, DeviceMemoryPlan]) -> dict:
    """JSON-ready: device name -> its plan's `to_dict()`."""
    return {name: p.to_dict() for name, p in plans.items()}
