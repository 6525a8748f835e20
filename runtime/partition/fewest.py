"""`memory` mode: the fewest partitions that fit, the devices in any sequence; then
boundary moves.

Along one sequence of devices, filling each as far as it goes reaches furthest (a
segment that fits still fits with nodes taken off either end), so the furthest position
R[s] that the devices counted in state s reach, in their best sequence, is

    R[s] = max over classes c used in s of reach(R[s - c], c)

with reach(a, c) the end of the longest segment from a that fits a device of class c,
which never falls as a grows. The fewest partitions are the fewest devices of a state
with R[s] = n. States count the devices used per class of twins, as `balanced`'s do;
past MAX_STATES, or where the canonical sequence needs no more devices, the devices keep
their canonical sequence (so plans that were already fewest stay as they were).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.partition.balanced import twin_classes
from runtime.partition.greedy import Split, fill, rebalance
from runtime.partition.record import Recorder, Steps, finish
from runtime.partition.segments import Segments

MAX_STATES = 1 << 12


def fewest_sequence(seg: Segments, devices: Sequence[DeviceConfig]) -> list[DeviceConfig]:
    """The devices in a sequence whose fill needs the fewest of them: `devices` as given
    unless another sequence needs fewer."""
    try:
        canonical = len(finish(fill(seg, devices, Recorder())))
    except PartitionError:
        canonical = len(devices) + 1
    classes = twin_classes(seg, devices)
    sizes = [i1 - i0 for i0, i1 in classes]
    count = math.prod(s + 1 for s in sizes)
    if canonical <= 1 or count > MAX_STATES:
        return list(devices)
    strides = np.cumprod([1, *[s + 1 for s in sizes[:-1]]]).tolist()
    furthest, via = [0] * count, [-1] * count
    used = [0] * count
    for s in range(1, count):
        for c, (stride, size) in enumerate(zip(strides, sizes, strict=True)):
            if s // stride % (size + 1) == 0:
                continue
            end = seg.furthest_end(furthest[s - stride], devices[classes[c][0]])
            if end > furthest[s] or via[s] < 0:
                furthest[s], via[s], used[s] = end, c, used[s - stride] + 1
    done = [s for s in range(count) if furthest[s] == seg.n]
    best = min(done, key=lambda s: (used[s], s), default=None)
    if best is None or used[best] >= canonical:
        return list(devices)
    sequence, s = [], best
    while s:
        c = via[s]
        i0, i1 = classes[c]
        sequence.append(devices[i0 + s // strides[c] % (i1 - i0 + 1) - 1])
        s -= strides[c]
    return sequence[::-1]


def memory_mode(seg: Segments, devices: Sequence[DeviceConfig], rec: Recorder) -> Steps[Split]:
    sequence = fewest_sequence(seg, devices)
    why = "" if sequence == list(devices) else (
        f"{len(sequence)} devices in this sequence ({', '.join(d.name for d in sequence)}) "
        f"hold it; filling the roomiest first takes more")
    split = yield from fill(seg, sequence, rec, why)
    return (yield from rebalance(seg, split, rec))
