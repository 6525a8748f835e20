"""`balanced` mode: the split of an order that minimises the slowest stage, exactly.

A split cuts the order into contiguous segments, each on a device of its own, in any
sequence of devices: a cpu may take the stem, accelerators the body and another cpu the
head. Devices that differ only by name, and that placement lets run the same nodes, form
a class; which twin takes a segment does not change its time. A state counts how many
devices of each class the split has used, and F[s, b] is the least bottleneck that puts
the first b nodes on the devices counted in s:

    F[s, b] = min over classes c used in s, starts a < b of max(F[s - c, a], time_c(a, b))

and the plan is the best F[s, n] over every s (with `every`, the full state: each device
used).
time_c(a, b) is the segment's compute on the class's device plus its end of the copies
in and out (bytes and count, each copy `link_latency + bytes / link_bandwidth`; copies
out are free for a device working in host memory, `cost.sends_over_link`). For each b
the copies in are kept as a vector over a, updated as b grows: a tensor read at b - 1
adds its copy to the starts that come after its producer and previous reader. Copies
out are kept per producer position, for the tensors made before b and read at or after
it; a reversed cumulative sum over the window turns them into a vector over a. Starts
whose compute alone exceeds a known feasible bottleneck (from greedy fill or an even
split) cannot be on an optimal path and are skipped, so each row scans about
n / devices starts, not n.

The states number the product of (class size + 1). Past MAX_CELLS states times nodes,
or MAX_WORK states times classes times nodes (a dozen devices that all differ, on a
thousand nodes) the devices keep their canonical sequence instead, each one optional:
state j is "the first j devices considered", reached from any earlier one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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

MAX_CELLS = 1 << 22  # states x positions the free-sequence programme may hold...
MAX_WORK = 1 << 24  # ... and states x classes x positions it may visit


def _even_split(seg: Segments, devices: Sequence[DeviceConfig]) -> Split | None:
    prefix = seg.prefix_seconds(devices[0])
    targets = prefix[-1] * np.arange(1, len(devices)) / len(devices)
    bounds = [0, *np.searchsorted(prefix, targets).tolist(), seg.n]
    split = [(a, b, d) for a, b, d in zip(bounds, bounds[1:], devices, strict=False) if b > a]
    return split if all(seg.fits(a, b, d) for a, b, d in split) else None


def _upper_bound(seg: Segments, devices: Sequence[DeviceConfig],
                 classes: list[tuple[int, int]]) -> float:
    """The slowest stage of a split known to fit: the tighter it is, the fewer starts the
    programme visits. Even splits over all the devices and over each class of twins (on
    op-limited accelerators, the cpus that run everything), and greedy filling."""
    best = np.inf
    for group in [devices, *(devices[i0:i1] for i0, i1 in classes if i1 - i0 < len(devices))]:
        if (even := _even_split(seg, group)) is not None:
            best = min(best, seg.bottleneck([a for a, _, _ in even] + [seg.n],
                                            [d for _, _, d in even]))
    try:
        greedy = finish(fill(seg, devices, Recorder()))
    except PartitionError:
        return best
    return min(best, seg.bottleneck([a for a, _, _ in greedy] + [seg.n],
                                    [d for _, _, d in greedy]))


def twin_classes(seg: Segments, devices: Sequence[DeviceConfig]) -> list[tuple[int, int]]:
    """Runs [i0, i1) of consecutive devices that differ only by name and that placement
    lets run the same nodes: one class, sharing its time vectors."""
    runs: list[tuple[int, int]] = []
    for i, dev in enumerate(devices):
        if runs and replace(devices[runs[-1][0]], name=dev.name) == dev and np.array_equal(
                seg.blocked_before(devices[runs[-1][0]]), seg.blocked_before(dev)):
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


@dataclass(frozen=True)
class _Move:
    """A segment put on a device of one class (`first`: the index of its first device,
    whose times stand for all): the state each move leads to (`dst`, ascending), the
    state it comes from (`src`) and the device (index) it uses."""
    first: int
    dst: np.ndarray
    src: np.ndarray
    device: np.ndarray


@dataclass(frozen=True)
class _States:
    count: int
    used: np.ndarray  # devices each state has used
    moves: list[_Move]
    free: bool  # any sequence of devices; else the canonical one, each device optional


def _states(classes: list[tuple[int, int]], n: int) -> _States:
    sizes = [i1 - i0 for i0, i1 in classes]
    count = math.prod(s + 1 for s in sizes)
    if count * (n + 1) <= MAX_CELLS and count * len(sizes) * (n + 1) <= MAX_WORK:
        # state: devices used per class, in mixed radix
        index = np.arange(count)
        strides = np.cumprod([1, *[s + 1 for s in sizes[:-1]]])
        per_class = [index // stride % (size + 1) for stride, size in zip(strides, sizes,
                                                                           strict=True)]
        moves = [_Move(i0, index[c >= 1], index[c >= 1] - stride, i0 + c[c >= 1] - 1)
                 for (i0, _), stride, c in zip(classes, strides, per_class, strict=True)]
        return _States(count, np.sum(per_class, axis=0), moves, free=True)
    k = classes[-1][1]  # state j: the first j devices considered
    moves = [_Move(i0, np.arange(i0 + 1, i1 + 1), np.arange(i0, i1), np.arange(i0, i1))
             for i0, i1 in classes]
    return _States(k + 1, np.arange(k + 1), moves, free=False)


def optimal_split(seg: Segments, devices: Sequence[DeviceConfig], every: bool = False,
                  limit: float = np.inf) -> Split:
    """The split minimising the slowest stage; `every`: one whose every device takes at
    least one node (what the split would be were none left idle), its slowest stage at
    most `limit` (splits over it are not searched: PartitionError if all are)."""
    n, k = seg.n, len(devices)
    if n == 0:
        return []
    classes = twin_classes(seg, devices)
    if not every:
        limit = _upper_bound(seg, devices, classes) * (1 + 1e-9) + 1e-15
    states = _states(classes, n)
    vectors = [(devices[m.first], seg.prefix_seconds(devices[m.first]),
                seg.lowest_start(devices[m.first])) for m in states.moves]
    best = np.full((states.count, n + 1), np.inf)
    best[0, 0] = 0.0
    # In the canonical sequence a device may be skipped: a move reads the best of every
    # state up to its source.
    skips = not (states.free or every)
    reach = np.full_like(best, np.inf) if skips else best
    if skips:
        reach[:, 0] = 0.0
    chose_start = np.full((states.count, n + 1), -1, dtype=np.int32)
    chose_move = np.full((states.count, n + 1), -1, dtype=np.int16)
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
        for m, (move, (dev, prefix, lowest)) in enumerate(zip(states.moves, vectors,
                                                              strict=True)):
            lo = max(int(lowest[b]), int(np.searchsorted(prefix, prefix[b] - limit)))
            if lo >= b:
                continue
            count, moved = copy_count[lo:b], copy_bytes[lo:b]
            if sends_over_link(dev):  # add what [a, b) makes and later stages read
                count = count + np.cumsum(send_count[lo:b][::-1])[::-1]
                moved = moved + np.cumsum(send_bytes[lo:b][::-1])[::-1]
            stage = (prefix[b] - prefix[lo:b]) + seg.model.fixed_seconds(dev) \
                + count * seg.model.latency(dev) + moved / dev.link_bandwidth
            cand = np.maximum(reach[move.src, lo:b], stage)
            at = cand.argmin(axis=1)
            value = cand[np.arange(len(at)), at]
            better = value < best[move.dst, b]
            best[move.dst[better], b] = value[better]
            chose_start[move.dst[better], b] = at[better] + lo
            chose_move[move.dst[better], b] = m
        if skips:
            reach[:, b] = np.minimum.accumulate(best[:, b])
    final = states.count - 1 if every else int(np.lexsort((states.used, best[:, n]))[0])
    if not np.isfinite(best[final, n]):
        weights = weight_bytes(seg.graph, seg.nodes)
        held = sum(d.memory_bytes for d in devices)
        raise PartitionError(f"too few devices for {seg.graph.name}: no split of its {n} nodes "
                             f"over {k} devices in this order fits their memory (weights "
                             f"{human_bytes(weights)}, the devices {human_bytes(held)} in all)")
    split: Split = []
    s, b = final, n
    while b > 0:
        a, move = int(chose_start[s, b]), states.moves[chose_move[s, b]]
        at = int(np.searchsorted(move.dst, s))
        split.append((a, b, devices[move.device[at]]))
        s, b = int(move.src[at]), a
        if skips:  # the state the best of those up to s came from
            s = int(np.flatnonzero(best[:s + 1, b] == reach[s, b])[-1])
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
