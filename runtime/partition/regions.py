"""Splits where placement forces a device to hold several stretches of the order.

When annotations or op support interleave devices (convolutions on the accelerator,
normalisations on the CPU), one contiguous segment per device cannot hold the graph.
Here the order keeps nodes with the same allowed devices together, is cut into
regions of equal allowed devices, and each region goes to one of them: in `balanced`
mode the one that keeps the busiest device least busy (copies in included), in
`memory` mode the previous region's device when it fits, so partitions stay few.
Consecutive regions on one device form one partition; a device may hold several.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runtime.cost import transfer_seconds
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.greedy import Split
from runtime.partition.liveness import peak_activation_bytes, weight_bytes
from runtime.partition.record import Recorder, Steps
from runtime.partition.segments import Segments
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
    for i, name in enumerate(seg.order):
        allowed = seg.allowed[name]
        if out and out[-1][2] == allowed:
            out[-1] = (out[-1][0], i + 1, allowed)
        else:
            out.append((i, i + 1, allowed))
    return out


class _Devices:
    """Running totals per device while regions are handed out."""

    def __init__(self, seg: Segments, devices: Sequence[DeviceConfig]):
        self.seg = seg
        self.load = {d.name: 0.0 for d in devices}
        self.parts: dict[str, list[tuple[int, int]]] = {d.name: [] for d in devices}
        self.at: dict[str, DeviceConfig] = {}  # tensor -> device it was made on
        self.sent: set[tuple[str, str]] = set()

    def seconds(self, a: int, b: int, device: DeviceConfig) -> float:
        """Compute on the device plus copies in not already sent there."""
        prefix = self.seg.prefix_seconds(device)
        copies = sum(transfer_seconds(size, device)
                     for t, size in self.seg.incoming(a, b).items()
                     if self.at.get(t, device) is not device and (t, device.name) not in self.sent)
        return float(prefix[b] - prefix[a]) + copies

    def fits(self, device: DeviceConfig, a: int, b: int, merge: bool) -> bool:
        """Would the device hold its partitions with [a, b) added (or merged into its last)?"""
        parts = list(self.parts[device.name])
        if merge:
            a = parts.pop()[0]
        parts.append((a, b))
        graph, nodes = self.seg.graph, self.seg.nodes
        need = sum(weight_bytes(graph, nodes[x:y]) for x, y in parts) + max(
            peak_activation_bytes(graph, nodes[x:y]) for x, y in parts)
        return need <= device.memory_bytes

    def take(self, a: int, b: int, device: DeviceConfig, seconds: float, merge: bool) -> None:
        self.load[device.name] += seconds
        parts = self.parts[device.name]
        if merge:
            parts[-1] = (parts[-1][0], b)
        else:
            parts.append((a, b))
        for t in self.seg.incoming(a, b):
            if self.at.get(t) is not device:
                self.sent.add((t, device.name))
        for node in self.seg.nodes[a:b]:
            for t in node.writes:
                self.at[t] = device


def region_split(seg: Segments, devices: Sequence[DeviceConfig], mode: str, rec: Recorder
                 ) -> Steps[Split]:
    state = _Devices(seg, devices)
    split: Split = []
    for a, b, allowed in _regions(seg):
        options = []
        for dev in (d for d in devices if d.name in allowed):
            same = bool(split) and split[-1][2] is dev
            if state.fits(dev, a, b, same):
                seconds = state.seconds(a, b, dev)
                busiest = max(state.load[dev.name] + seconds,
                              *(v for k, v in state.load.items() if k != dev.name))
                key = (not same, busiest) if mode == "memory" else (busiest, not same)
                options.append((key, dev, seconds))
        if not options:
            names = ", ".join(sorted(allowed))
            raise PartitionError(
                f"too few devices for {seg.graph.name}: nodes {seg.order[a]}..{seg.order[b - 1]} "
                f"may run only on {names}, and none has room left")
        _, dev, seconds = min(options, key=lambda o: o[0])
        same = bool(split) and split[-1][2] is dev
        state.take(a, b, dev, seconds, same)
        if same:
            split[-1] = (split[-1][0], b, dev)
            p = len(split) - 1
        else:
            p = len(split)
            split.append((a, b, dev))
            yield rec.step("open", f"open partition {p} on {dev.name}: next nodes may run only "
                           f"on {', '.join(sorted(allowed))}", p, dev.name)
        for i in range(a, b):
            yield rec.step("assign", f"{seg.order[i]} -> partition {p} on {dev.name} "
                           f"(region adds {human_seconds(seconds)})", p, dev.name,
                           (seg.order[i],))
    return split
