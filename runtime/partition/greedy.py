"""Greedy fill and boundary moves, the parts of `memory` mode (`fewest.py`).

Glow's greedy fill closes a partition when the next node no longer fits. Because a
segment's memory only grows as it grows, filling each device as far as it goes gives
the fewest partitions for the order and that sequence of devices. Moving single nodes
across boundaries then lowers the slowest stage without adding a partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.partition.record import Recorder, Steps
from runtime.partition.segments import Segments
from runtime.units import human_bytes, human_seconds

Split = list[tuple[int, int, DeviceConfig]]


def reach(seg: Segments, a: int, device: DeviceConfig) -> int:
    """The furthest b such that [a, b) fits and runs on the device (a if none): a binary
    search, as fitting only fails more as b grows (each test walks the segment).
    Memoised on `seg`, for `fewest` asks again what filling asked."""
    memo = seg.__dict__.setdefault("_reach", {})
    if (a, device) not in memo:
        lo, hi = a, seg.n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if seg.fits(a, mid, device):
                lo = mid
            else:
                hi = mid - 1
        memo[a, device] = lo
    return memo[a, device]


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
        b = reach(seg, a, dev)
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


def rebalance(seg: Segments, split: Split, rec: Recorder, limit: int = 2000) -> Steps[Split]:
    """Move one node at a time off the slowest stage while that lowers it."""
    bounds = [a for a, _, _ in split] + [seg.n]
    devs = [d for _, _, d in split]
    times = [seg.seconds(a, b, d) for a, b, d in zip(bounds, bounds[1:], devs, strict=False)]
    for _ in range(limit if times else 0):
        s = max(range(len(times)), key=times.__getitem__)
        best = None
        for nb, cut, new_cut in ((s + 1, s + 1, bounds[s + 1] - 1), (s - 1, s, bounds[s] + 1)):
            if not 0 <= nb < len(devs):
                continue
            trial = bounds.copy()
            trial[cut] = new_cut
            pair = sorted((s, nb))
            if any(trial[i] >= trial[i + 1] or not seg.fits(trial[i], trial[i + 1], devs[i])
                   for i in pair):
                continue
            new = {i: seg.seconds(trial[i], trial[i + 1], devs[i]) for i in pair}
            if max(new.values()) < times[s] * (1 - 1e-9) and (
                    best is None or max(new.values()) < max(best[2].values())):
                best = (nb, trial, new)
        if best is None:
            break
        nb, bounds, new = best
        old = times[s]
        for i, t in new.items():
            times[i] = t
        node = seg.order[bounds[s] - 1] if nb < s else seg.order[bounds[s + 1]]
        yield rec.step("move", f"moved {node} from partition {s} to {nb}: stage {s} "
                       f"{human_seconds(old)} -> {human_seconds(times[s])}", nb, devs[nb].name,
                       (node,))
    return [(a, b, d) for a, b, d in zip(bounds, bounds[1:], devs, strict=False)]

