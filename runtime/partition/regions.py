"""Splits where placement forces a device to hold several stretches of the order.

When annotations or op support interleave devices (convolutions on the accelerator,
normalisations on the CPU), one contiguous segment per device cannot hold the graph.
Here the order keeps nodes with the same allowed devices together and is cut into
regions of equal allowed devices; regions go to devices allowed there:

- `balanced`, region by region: to the device that keeps the busiest device least
  busy, counting compute and both ends of each copy (`cost.transfer_seconds`: the
  receiving end on the device taking the region, the sending end on the device that
  made the tensor, once a tensor).
- `memory`, run by run: where a partition must open, to the device that can take the
  most consecutive regions from there (allowed in all of them, with room), ties to the
  fewer bytes copied in, then the least busy. Taking the farthest reach each time gives
  the fewest partitions (a run that reaches further never needs more runs after it)
  whenever memory left on a device by its earlier partitions does not bind.
- `stay`, region by region: the previous region's device when it has room, else the
  least busy. Where memory binds, a long run can leave a device too little room for a
  later stretch only it may run, and staying sometimes does better; callers try both.

A region no device has room for is cut where the device with the most room left stops,
and the rest is handed out as a region of its own.

Consecutive regions on one device form one partition; a device may hold several.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.greedy import Split
from runtime.partition.memory_plan import device_peak_bytes
from runtime.partition.record import Recorder, Steps
from runtime.partition.segments import Segments, last_true
from runtime.units import human_seconds


def placement_order(graph: Graph, allowed: Mapping[str, frozenset[str]]) -> list[str]:
    """A topological order that stays with nodes allowed on the same devices, depth first."""
    indegree = {n: graph.dag.in_degree(n) for n in graph.dag}
    ready = [n.name for n in graph.nodes if indegree[n.name] == 0][::-1]
    order: list[str] = []
    while ready:
        current = allowed[order[-1]] if order else None
        pick = next((i for i in range(len(ready) - 1, -1, -1) if allowed[ready[i]] == current),
                    len(ready) - 1)
        node = ready.pop(pick)
        order.append(node)
        for succ in sorted(graph.dag.successors(node), key=lambda s: -graph.node(s).index):
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
    return order


def _regions(seg: Segments) -> list[tuple[int, int, frozenset[str]]]:
    out: list[tuple[int, int, frozenset[str]]] = []
    assert seg.allowed is not None, "regions follow placement's allowed devices"
    for i, name in enumerate(seg.order):
        allowed = seg.allowed[name]
        if out and out[-1][2] == allowed:
            out[-1] = (out[-1][0], i + 1, allowed)
        else:
            out.append((i, i + 1, allowed))
    return out


@dataclass(frozen=True)
class _Part:
    """A stretch of the order a device holds, as the memory plan reads a partition."""
    name: str
    device: str
    nodes: tuple[str, ...]


class _Devices:
    """Running totals per device while regions are handed out."""

    def __init__(self, seg: Segments, devices: Sequence[DeviceConfig]):
        self.seg = seg
        self.load = {d.name: 0.0 for d in devices}
        self.parts: dict[str, list[tuple[int, int]]] = {d.name: [] for d in devices}
        self.touched = {d.name: 0.0 for d in devices}  # bytes its parts touch, summed
        self.at: dict[str, DeviceConfig] = {}  # tensor -> device it was made on
        self.sent: set[tuple[str, str]] = set()  # (tensor, device it was copied to)
        self.out: set[str] = set()  # tensors their device has sent out

    def copies_in(self, a: int, b: int, device: DeviceConfig) -> dict[str, int]:
        """Activations [a, b) reads that another device made and has not copied here yet."""
        return {t: size for t, size in self.seg.incoming(a, b).items()
                if self.at[t].name != device.name and (t, device.name) not in self.sent}

    def added(self, a: int, b: int, device: DeviceConfig) -> dict[str, float]:
        """Seconds each device gains if [a, b) runs on `device`: compute and the receiving
        end of its copies there, the sending end on the devices that made them."""
        prefix = self.seg.prefix_seconds(device)
        add = {device.name: float(prefix[b] - prefix[a])}
        for t, size in self.copies_in(a, b, device).items():
            add[device.name] += self.seg.model.receive_seconds(size, device)
            if t not in self.out:
                src = self.at[t]
                add[src.name] = add.get(src.name, 0.0) + self.seg.model.send_seconds(size, src)
        return add

    def busiest(self, add: dict[str, float]) -> float:
        return max(load + add.get(name, 0.0) for name, load in self.load.items())

    def fits(self, device: DeviceConfig, a: int, b: int, merge: bool) -> bool:
        """Would the device hold its partitions with [a, b) added (or merged into its last)?"""
        parts = self.parts[device.name]
        touched = self.touched[device.name]
        if merge:
            touched -= self.seg.touched_bytes(*parts[-1])
            a = parts[-1][0]
        if touched + self.seg.touched_bytes(a, b) <= device.memory_bytes:
            return True  # even counting every byte touched, it fits
        parts = [*(parts[:-1] if merge else parts), (a, b)]
        # Each stretch's peak alone is live at once on the device; the device's peak is at
        # most their peaks and their inputs summed (a tensor waiting between stretches was
        # an input of one, or live at the end of the one that made it). Bounds that
        # settle most asks without the device's timeline.
        alone = [self.seg.stretch().split(x, y) for x, y in parts]
        weights = sum(w for w, _, _ in alone)
        if weights + sum(p + i for _, p, i in alone) <= device.memory_bytes:
            return True
        if weights + max(p for _, p, _ in alone) > device.memory_bytes:
            return False
        graph, order = self.seg.graph, self.seg.order
        # as the plan will count it: each part's weights, and the device's arena, where
        # a tensor kept from one of its parts to a later one counts while it waits
        held = [_Part(str(i), device.name, tuple(order[x:y])) for i, (x, y) in enumerate(parts)]
        need = weights + device_peak_bytes(held, graph, device.name)
        return need <= device.memory_bytes

    def take(self, a: int, b: int, device: DeviceConfig, merge: bool) -> float:
        """Run [a, b) on the device; return the seconds it adds there."""
        add = self.added(a, b, device)
        for name, seconds in add.items():
            self.load[name] += seconds
        parts = self.parts[device.name]
        if merge:
            self.touched[device.name] -= self.seg.touched_bytes(*parts[-1])
            parts[-1] = (parts[-1][0], b)
        else:
            parts.append((a, b))
        self.touched[device.name] += self.seg.touched_bytes(*parts[-1])
        for t in self.copies_in(a, b, device):
            self.sent.add((t, device.name))
            self.out.add(t)
        for node in self.seg.nodes[a:b]:
            for t in node.writes:
                self.at[t] = device
        return add[device.name]


Region = tuple[int, int, frozenset[str]]


def _one_region(state: _Devices, regions: list[Region], i: int,
                devices: Sequence[DeviceConfig], last: DeviceConfig | None, *,
                stay: bool) -> tuple[DeviceConfig, int] | None:
    """Region i alone, on the device keeping the busiest device least busy (`stay`: on the
    previous region's device first, when it has room)."""
    a, b, allowed = regions[i]
    options = []
    for dev in devices:
        same = dev is last
        if dev.name in allowed and state.fits(dev, a, b, same):
            busiest = state.busiest(state.added(a, b, dev))
            options.append(((not same, busiest) if stay else (busiest, not same), dev, i + 1))
    return min(options, key=lambda o: o[0])[1:] if options else None


def _longest_run(state: _Devices, regions: list[Region], i: int,
                 devices: Sequence[DeviceConfig], last: DeviceConfig | None
                 ) -> tuple[DeviceConfig, int] | None:
    """Regions i..end-1 on the allowed device that reaches furthest with room."""
    a = regions[i][0]
    options = []
    for dev in devices:
        same = dev is last
        allowed_to = i
        while allowed_to < len(regions) and dev.name in regions[allowed_to][2]:
            allowed_to += 1
        lo = last_true(i, allowed_to,  # the lambda runs here, in this iteration
                       lambda j: state.fits(dev, a, regions[j - 1][1], same))  # noqa: B023
        if lo > i:
            b = regions[lo - 1][1]
            moved = sum(state.copies_in(a, b, dev).values())
            options.append(((-lo, moved, state.busiest(state.added(a, b, dev))), dev, lo))
    return min(options, key=lambda o: o[0])[1:] if options else None


def _farthest_cut(state: _Devices, region: Region, devices: Sequence[DeviceConfig],
                  last: DeviceConfig | None) -> int | None:
    """The furthest c inside the region such that some device allowed there has room for
    [a, c) (None: not even for its first node)."""
    a, b, allowed = region
    best = None
    for dev in devices:
        if dev.name not in allowed:
            continue
        lo = last_true(a, b - 1, lambda c: state.fits(dev, a, c, dev is last))  # noqa: B023
        if lo > a and (best is None or lo > best):
            best = lo
    return best


Chooser = Callable[[_Devices, list[Region], int, Sequence[DeviceConfig], DeviceConfig | None],
                   tuple[DeviceConfig, int] | None]
STYLES: dict[str, Chooser] = {"balanced": partial(_one_region, stay=False),
                              "memory": _longest_run, "stay": partial(_one_region, stay=True)}


def region_split(seg: Segments, devices: Sequence[DeviceConfig], style: str, rec: Recorder
                 ) -> Steps[Split]:
    """Hand the regions of `seg.order` to devices in one of the STYLES."""
    state = _Devices(seg, devices)
    regions = _regions(seg)
    choose = STYLES[style]
    split: Split = []
    i = 0
    while i < len(regions):
        last = split[-1][2] if split else None
        chosen = choose(state, regions, i, devices, last)
        if chosen is None:  # no device has room for the whole region: take its front
            a, b, allowed = regions[i]
            cut = _farthest_cut(state, regions[i], devices, last)
            if cut is None:
                raise PartitionError(
                    f"too few devices for {seg.graph.name}: nodes {seg.order[a]}.."
                    f"{seg.order[b - 1]} may run only on {', '.join(sorted(allowed))}, and "
                    f"none has room left")
            regions[i:i + 1] = [(a, cut, allowed), (cut, b, allowed)]
            chosen = choose(state, regions, i, devices, last)
            assert chosen is not None, "a device has room for the region's front"
        dev, end = chosen
        if dev is not last:  # open a partition, empty until its first region is taken
            split.append((regions[i][0], regions[i][0], dev))
            p = len(split) - 1
            names = ", ".join(sorted(regions[i][2]))
            why = (f"of {names}, it can take the most regions from here ({end - i}, through "
                   f"{seg.order[regions[end - 1][1] - 1]})" if style == "memory" else
                   f"next nodes may run only on {names}")
            yield rec.step("open", f"open partition {p} on {dev.name}: {why}", p, dev.name)
        p = len(split) - 1
        for a, b, _ in regions[i:end]:
            seconds = state.take(a, b, dev, merge=split[p][1] > split[p][0])
            split[p] = (split[p][0], b, dev)
            for k in range(a, b):
                yield rec.step("assign", f"{seg.order[k]} -> partition {p} on {dev.name} "
                               f"(region adds {human_seconds(seconds)})", p, dev.name,
                               (seg.order[k],))
        i = end
    return split
