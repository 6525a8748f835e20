"""`balanced` mode: the split of an order that minimises the slowest stage, exactly.

F[j, b] is the least bottleneck that puts the first b nodes on the first j devices
(each device one contiguous segment, possibly empty):

    F[j, b] = min(F[j-1, b], min_a max(F[j-1, a], time_j(a, b)))

time_j(a, b) is the segment's compute on device j plus device j's end of its copies
in and out (bytes and count, each copy `link_latency + bytes / link_bandwidth`; copies
out are free for a device working in host memory, `cost.sends_over_link`). For
each b the copies in are kept as a vector over a, updated as b grows: a tensor read at
b - 1 adds its copy to the starts that come after its producer and previous reader.
Copies out are kept per producer position, for the tensors made before b and read at
or after it; a reversed cumulative sum over the window turns them into a vector over
a. Starts whose compute alone exceeds a known feasible bottleneck (from greedy fill or
an even split) cannot be on an optimal path and are skipped, so each row scans about
n / devices starts, not n.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from runtime.cost import sends_over_link
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.partition.greedy import Split, fill
from runtime.partition.liveness import weight_bytes
from runtime.partition.order import cut_bytes
from runtime.partition.record import Recorder, Steps, finish
from runtime.partition.segments import Segments
from runtime.units import human_bytes, human_seconds


def _even_split(seg: Segments, devices: Sequence[DeviceConfig]) -> Split | None:
    prefix = seg.prefix_seconds(devices[0])
    targets = prefix[-1] * np.arange(1, len(devices)) / len(devices)
    bounds = [0, *np.searchsorted(prefix, targets).tolist(), seg.n]
    split = [(a, b, d) for a, b, d in zip(bounds, bounds[1:], devices, strict=False) if b > a]
    return split if all(seg.fits(a, b, d) for a, b, d in split) else None


def _upper_bound(seg: Segments, devices: Sequence[DeviceConfig]) -> float:
    best = np.inf
    even = _even_split(seg, devices)
    if even:
        best = seg.bottleneck([a for a, _, _ in even] + [seg.n], [d for _, _, d in even])
    try:
        greedy = finish(fill(seg, devices, Recorder()))
    except PartitionError:
        return best
    return min(best, seg.bottleneck([a for a, _, _ in greedy] + [seg.n],
                                    [d for _, _, d in greedy]))


def optimal_split(seg: Segments, devices: Sequence[DeviceConfig], every: bool = False
                  ) -> Split:
    """The split minimising the slowest stage; `every`: one whose every device takes at
    least one node (what the split would be were none left idle)."""
    n, k = seg.n, len(devices)
    if n == 0:
        return []
    limit = np.inf if every else _upper_bound(seg, devices) * (1 + 1e-9) + 1e-15
    # Rows of consecutive devices that differ only by name, and that placement lets run
    # the same nodes, share their vectors.
    runs: list[tuple[int, int, DeviceConfig, np.ndarray, np.ndarray]] = []
    for i, dev in enumerate(devices):
        if runs and replace(runs[-1][2], name=dev.name) == dev and np.array_equal(
                seg.blocked_before(runs[-1][2]), seg.blocked_before(dev)):
            runs[-1] = (runs[-1][0], i + 1, *runs[-1][2:])
        else:
            runs.append((i, i + 1, dev, seg.prefix_seconds(dev), seg.lowest_start(dev)))
    best = np.full((k + 1, n + 1), np.inf)
    if every:  # no device may be empty: only zero devices hold zero nodes
        best[0, 0] = 0.0
    else:
        best[:, 0] = 0.0
    choice = np.full((k + 1, n + 1), -1, dtype=np.int64)
    copy_bytes = np.zeros(n + 1)
    copy_count = np.zeros(n + 1)
    # Copies out, per producer position p < b: the tensors made at p and read at or after b.
    send_bytes = np.zeros(n + 1)
    send_count = np.zeros(n + 1)
    last_read: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (producer, bytes)
    for p, entries in enumerate(seg.made_at):
        for _, size, last in entries:
            last_read[last].append((p, size))
    for b in range(1, n + 1):
        for _, size, prev in seg.reads_at[b - 1]:
            copy_bytes[prev + 1:b] += size
            copy_count[prev + 1:b] += 1
        for p, size in last_read[b - 1]:  # read for the last time at b - 1: no longer sent
            send_bytes[p] -= size
            send_count[p] -= 1
        for _, size, _ in seg.made_at[b - 1]:
            send_bytes[b - 1] += size
            send_count[b - 1] += 1
        col = np.full(k, np.inf)
        arg = np.full(k, -1, dtype=np.int64)
        for i0, i1, dev, prefix, lowest in runs:
            lo = max(int(lowest[b]), int(np.searchsorted(prefix, prefix[b] - limit)))
            if lo >= b:
                continue
            count, moved = copy_count[lo:b], copy_bytes[lo:b]
            if sends_over_link(dev):  # add what [a, b) makes and later stages read
                count = count + np.cumsum(send_count[lo:b][::-1])[::-1]
                moved = moved + np.cumsum(send_bytes[lo:b][::-1])[::-1]
            stage = (prefix[b] - prefix[lo:b]) + seg.model.fixed_seconds(dev) \
                + count * seg.model.latency(dev) + moved / dev.link_bandwidth
            cand = np.maximum(best[i0:i1, lo:b], stage)
            at = cand.argmin(axis=1)
            col[i0:i1] = cand[np.arange(i1 - i0), at]
            arg[i0:i1] = at + lo
        if every:  # device j takes [a, b) with a < b: no device is skipped
            best[1:, b], choice[1:, b] = col, arg
            continue
        acc = np.minimum.accumulate(col)
        before = np.concatenate(([best[0, b]], acc[:-1]))
        best[1:, b] = np.minimum(acc, before)
        choice[1:, b] = np.where(col <= before, arg, -1)
    if not np.isfinite(best[k, n]):
        weights = weight_bytes(seg.graph, seg.nodes)
        held = sum(d.memory_bytes for d in devices)
        raise PartitionError(f"too few devices for {seg.graph.name}: no split of its {n} nodes "
                             f"over {k} devices in this order fits their memory (weights "
                             f"{human_bytes(weights)}, the devices {human_bytes(held)} in all)")
    split: Split = []
    b, j = n, k
    while j > 0:
        a = int(choice[j, b])
        if a >= 0:
            split.append((a, b, devices[j - 1]))
            b = a
        j -= 1
    return split[::-1]


def balanced_mode(seg: Segments, devices: Sequence[DeviceConfig], rec: Recorder
                  ) -> Steps[Split]:
    split = optimal_split(seg, devices)
    times = [seg.seconds(a, b, d) for a, b, d in split]
    worst = max(times, default=0.0)
    cuts = cut_bytes(seg.graph, seg.order)
    for p, ((a, b, dev), t) in enumerate(zip(split, times, strict=True)):
        yield rec.step("open", f"open partition {p} on {dev.name}: stage {human_seconds(t)} of the "
                       f"optimal bottleneck {human_seconds(worst)}", p, dev.name)
        for i in range(a, b):
            yield rec.step("assign", f"{seg.order[i]} -> partition {p} (optimal split)", p,
                           dev.name, (seg.order[i],))
        if b < seg.n:
            yield rec.step("close", f"closed partition {p} at {seg.order[b - 1]}: "
                           f"{human_seconds(t)}, memory {human_bytes(seg.memory(a, b))}; "
                           f"cut carries {human_bytes(cuts[b])}", p, dev.name)
    return split
