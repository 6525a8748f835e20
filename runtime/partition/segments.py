"""Contiguous segments of a topological order: their memory, time and copies in and out.

A segment [a, b) holds the nodes at positions a..b-1 of the order and runs on one
device. Its time is the device's roofline time for its nodes plus its own end of each
copy (`cost.transfer_seconds`): one in for every activation made before `a` and read
inside, one out for every activation made inside and read at or after `b` (free for a
device working in host memory). A tensor made from weights alone crosses no cut: the
segments reading it make it as they load (`Graph.is_constant`). Time thus depends on
the segment's bounds and device alone, which keeps the windowed dynamic programme in
`balanced` exact. Memory only grows when a segment grows at either end, which is what
makes greedy filling exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from runtime.cost import CostModel
from runtime.devices.config import DeviceConfig
from runtime.graph import Graph
from runtime.partition.liveness import StretchMemory


def last_true(lo: int, hi: int, holds: Callable[[int], bool]) -> int:
    """The largest x in [lo, hi] that `holds`, by bisection: it holds at lo (or nothing
    does and lo comes back), and once it fails it fails for every larger x, as a fit does
    when a stretch grows."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid - 1)
    return lo


class Segments:
    def __init__(self, graph: Graph, model: CostModel, order: Sequence[str],
                 allowed: Mapping[str, frozenset[str]] | None = None):
        self.graph, self.model, self.order = graph, model, list(order)
        costs = model.costs
        self.allowed = allowed  # node -> devices placement lets it run on (None: any)
        self.nodes = [graph.node(n) for n in self.order]
        self.n = len(self.order)
        position = {name: i for i, name in enumerate(self.order)}
        # Per position: (tensor, bytes, prev) for every activation read there that some
        # node made; prev = the later of its producer and its previous reader. A tensor
        # made from weights alone is no activation: its readers make it as they load.
        self.reads_at: list[list[tuple[str, int, int]]] = []
        last_seen: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            entries = []
            for t in node.reads:
                if t in graph.producer and not graph.is_constant(t):
                    prev = last_seen.get(t, position[graph.producer[t]])
                    entries.append((t, graph.tensor_bytes(t), prev))
                    last_seen[t] = i
            self.reads_at.append(entries)
        # Per position: (tensor, bytes, last) for every activation made there and read
        # later; last = the position of its last reader. A segment [a, b) sends it out
        # when a <= its producer < b <= last.
        self.made_at: list[list[tuple[str, int, int]]] = [
            [(t, graph.tensor_bytes(t), last_seen[t]) for t in node.writes if t in last_seen]
            for node in self.nodes]
        touched = [costs[n].weight_bytes + costs[n].bytes_moved for n in self.order]
        self._upper = np.concatenate([[0], np.cumsum(touched, dtype=np.float64)])

    # Memoised per instance: a functools.cache on a method is keyed on self at class
    # level, which kept every Segments (and its graph) alive for the life of the process.
    def prefix_seconds(self, device: DeviceConfig) -> np.ndarray:
        memo = self.__dict__.setdefault("_prefix_seconds", {})
        if device not in memo:
            per_node = [self.model.node_seconds(n, device) for n in self.order]
            memo[device] = np.concatenate([[0.0], np.cumsum(per_node)])
        return memo[device]

    def blocked_before(self, device: DeviceConfig) -> np.ndarray:
        """u[i] = how many of the first i nodes placement keeps off the device."""
        memo = self.__dict__.setdefault("_blocked_before", {})
        if device not in memo:
            allowed = self.allowed or {}
            bad = [n in allowed and device.name not in allowed[n] for n in self.order]
            memo[device] = np.concatenate([[0], np.cumsum(bad)])
        return memo[device]

    def memory(self, a: int, b: int) -> int:
        """Weights plus peak live activations of [a, b), as `liveness` counts them."""
        return self.stretch()(a, b)

    def stretch(self) -> StretchMemory:
        if "_stretch" not in self.__dict__:
            self._stretch = StretchMemory(self.graph, self.nodes)
        return self._stretch

    def runnable(self, a: int, b: int, device: DeviceConfig) -> bool:
        u = self.blocked_before(device)
        return u[b] == u[a]

    def touched_bytes(self, a: int, b: int) -> float:
        """Every byte [a, b) reads or writes, weights included: a cheap bound on its memory."""
        return float(self._upper[b] - self._upper[a])

    def fits(self, a: int, b: int, device: DeviceConfig) -> bool:
        if not self.runnable(a, b, device):
            return False
        if self.touched_bytes(a, b) <= device.memory_bytes:
            return True  # even counting every byte touched, it fits
        return self.memory(a, b) <= device.memory_bytes

    def incoming(self, a: int, b: int) -> dict[str, int]:
        """Activations made before a and read in [a, b): tensor -> bytes."""
        return {t: size for i in range(a, b) for t, size, prev in self.reads_at[i]
                if prev < a}

    def outgoing(self, a: int, b: int) -> dict[str, int]:
        """Activations made in [a, b) and read at or after b: tensor -> bytes."""
        return {t: size for i in range(a, b) for t, size, last in self.made_at[i] if last >= b}

    def seconds(self, a: int, b: int, device: DeviceConfig) -> float:
        """Compute, the run's fixed costs, and this device's end of every copy in and out."""
        if a == b:
            return 0.0
        prefix, model = self.prefix_seconds(device), self.model
        copies = sum(model.receive_seconds(size, device) for size in self.incoming(a, b).values()) \
            + sum(model.send_seconds(size, device) for size in self.outgoing(a, b).values())
        return float(prefix[b] - prefix[a]) + model.fixed_seconds(device) + copies

    def furthest_end(self, a: int, device: DeviceConfig) -> int:
        """The furthest b such that [a, b) fits and runs on the device (a if none): a
        bisection, as fitting only fails more as b grows. Memoised per start and device:
        `fewest` asks again what filling asked."""
        memo = self.__dict__.setdefault("_furthest_end", {})
        if (a, device) not in memo:
            memo[a, device] = last_true(a, self.n, lambda b: self.fits(a, b, device))
        return memo[a, device]

    def lowest_start(self, device: DeviceConfig) -> np.ndarray:
        """lo[b] = the smallest a such that [a, b) fits and runs on the device (b if none)."""
        memo = self.__dict__.setdefault("_lowest_start", {})
        if device not in memo:
            lo = np.zeros(self.n + 1, dtype=np.int64)
            a = 0
            for b in range(1, self.n + 1):
                while a < b and not self.fits(a, b, device):
                    a += 1
                lo[b] = a
            memo[device] = lo
        return memo[device]

    def bottleneck(self, bounds: Sequence[int], devices: Sequence[DeviceConfig]) -> float:
        """The slowest segment of a split given as boundaries [0, b1, ..., n]."""
        return max((self.seconds(a, b, d) for a, b, d in zip(bounds, bounds[1:], devices,
                                                             strict=False)), default=0.0)
