"""Greedy fill and boundary moves, the parts of `memory` mode (`fewest.py`).

Glow's greedy fill closes a partition when the next node no longer fits. Because a
segment's memory only grows as it grows, filling each device as far as it goes gives
the fewest partitions for the order and that sequence of devices. Moving nodes across
boundaries then lowers the slowest stage without adding a partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.partition.record import Recorder, Steps
from runtime.partition.segments import Segments, last_true
from runtime.units import human_bytes, human_seconds

Split = list[tuple[int, int, DeviceConfig]]


def fill(seg: Segments, devices: Sequence[DeviceConfig], rec: Recorder, why: str = ""
         ) -> Steps[Split]:
    """Each device in turn as far as the next node fits; `why` explains the first open."""
    split: Split = []
    a, remaining = 0, list(devices)
    while a < seg.n:
        if not remaining:
            raise PartitionError(
                f"too few devices for {seg.graph.name}: {len(devices)} devices hold {a} of "
                f"{seg.n} nodes (next: {seg.order[a]}); add devices or memory")
        dev = remaining.pop(0)
        b = seg.furthest_end(a, dev)
        if b == a:
            node = seg.nodes[a]
            why = (f"cannot run {node.op_type}" if not seg.runnable(a, a + 1, dev) else
                   f"needs {human_bytes(seg.memory(a, a + 1))}, {dev.name} has "
                   f"{human_bytes(dev.memory_bytes)}")
            yield rec.step("skip", f"skip {dev.name}: next node {node.name} {why}",
                           device=dev.name)
            continue
        p = len(split)
        yield rec.step("open", f"open partition {p} on {dev.name} "
                       f"({human_bytes(dev.memory_bytes)})" + (f": {why}" if why and not p
                                                               else ""), p, dev.name)
        for i in range(a, b):
            yield rec.step("assign", f"{seg.order[i]} fits in partition {p}", p, dev.name,
                           (seg.order[i],))
        if b < seg.n:
            used = seg.memory(a, b)
            need = seg.memory(a, b + 1) - used
            why = (f"next node {seg.order[b]} needs {human_bytes(need)}, "
                   f"{human_bytes(dev.memory_bytes - used)} free")
            if not seg.runnable(a, b + 1, dev):
                why = f"{dev.name} cannot run {seg.nodes[b].op_type} ({seg.order[b]})"
            yield rec.step("close", f"closed partition {p}: {why}", p, dev.name)
        split.append((a, b, dev))
        a = b
    return split


def _moved(bounds: list[int], s: int, nb: int, m: int) -> list[int]:
    """The boundaries with m nodes moved from stage s to its neighbour nb."""
    trial = bounds.copy()
    trial[s + 1 if nb > s else s] += -m if nb > s else m
    return trial


def _tries(seg: Segments, bounds: list[int], devs: Sequence[DeviceConfig], s: int, nb: int
           ) -> list[int]:
    """How many nodes to try moving from stage s to nb: one, and the two around where
    their times cross, within what nb has room for (both found by bisection: nb only
    grows and s only shrinks as nodes move)."""
    def room(m: int) -> bool:
        t = _moved(bounds, s, nb, m)
        return seg.fits(t[nb], t[nb + 1], devs[nb])

    lo, hi = 1, last_true(0, bounds[s + 1] - bounds[s] - 1, room)  # s keeps a node
    if hi == 0:
        return []
    while lo < hi:
        mid = (lo + hi) // 2
        t = _moved(bounds, s, nb, mid)
        behind = seg.seconds(t[nb], t[nb + 1], devs[nb]) < seg.seconds(t[s], t[s + 1], devs[s])
        lo, hi = (mid + 1, hi) if behind else (lo, mid)
    return sorted({1, max(1, lo - 1), lo})


def rebalance(seg: Segments, split: Split, rec: Recorder, limit: int = 2000) -> Steps[Split]:
    """Move nodes off the slowest stage to a neighbour while that lowers it: one node, or
    as many as bring the two stages' times together."""
    bounds = [a for a, _, _ in split] + [seg.n]
    devs = [d for _, _, d in split]
    times = [seg.seconds(a, b, d) for a, b, d in zip(bounds, bounds[1:], devs, strict=False)]
    for _ in range(limit if times else 0):
        s = max(range(len(times)), key=times.__getitem__)
        best = None
        for nb in (s + 1, s - 1):
            if not 0 <= nb < len(devs):
                continue
            for m in _tries(seg, bounds, devs, s, nb):
                trial = _moved(bounds, s, nb, m)
                new = {i: seg.seconds(trial[i], trial[i + 1], devs[i]) for i in (s, nb)}
                if max(new.values()) < times[s] * (1 - 1e-9) and (
                        best is None or max(new.values()) < max(best[2].values())):
                    best = (nb, trial, new)
        if best is None:
            break
        nb, trial, new = best
        old = times[s]
        for i, t in new.items():
            times[i] = t
        moved = seg.order[trial[s + 1]:bounds[s + 1]] if nb > s else seg.order[bounds[s]:trial[s]]
        bounds = trial
        what = moved[0] if len(moved) == 1 else f"{len(moved)} nodes ({moved[0]}..{moved[-1]})"
        yield rec.step("move", f"moved {what} from partition {s} to {nb}: stage {s} "
                       f"{human_seconds(old)} -> {human_seconds(times[s])}", nb, devs[nb].name,
                       tuple(moved))
    return [(a, b, d) for a, b, d in zip(bounds, bounds[1:], devs, strict=False)]

