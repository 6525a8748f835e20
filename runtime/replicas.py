"""Replication (Glow's saturateHost): whole replicas of a plan on free twin devices.

With `replicas=N` the plan is made over the first 1/N of the devices (in canonical
order) and placed N-1 more times onto twins: devices with the same figures. With
"saturate" the plan uses the fewest devices it fits on, and is placed onto as many twin
groups as remain.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError, PrismError
from runtime.partition import Plan, canonical_devices

T = TypeVar("T")


def planned_over(devices: Sequence[DeviceConfig], replicas: int | str,
                 attempt: Callable[[list[DeviceConfig]], T]) -> T:
    """Plan one replica: `attempt(some devices)` plans on them, or raises PartitionError.
    "saturate" tries the fewest devices first and keeps the first plan that fits, so
    each device count is planned once; N shares every group of twins N ways."""
    if replicas == 1:
        return attempt(list(devices))
    ordered = canonical_devices(devices)
    if replicas == "saturate":
        for k in range(1, len(ordered)):
            try:
                return attempt(ordered[:k])
            except PartitionError:
                continue
        return attempt(ordered)  # all of them: its error, if any, is the one to tell
    if not isinstance(replicas, int) or replicas < 1:
        raise PrismError(f"replicas must be a whole number >= 1 or 'saturate', got {replicas!r}")
    if replicas > len(ordered):
        raise PrismError(f"replicas={replicas} needs at least {replicas} devices; "
                         f"the host has {len(ordered)}")
    groups: dict[tuple, list[DeviceConfig]] = {}  # in canonical order, first seen first
    for d in ordered:
        groups.setdefault(d.figures(), []).append(d)
    share = [d for g in groups.values() for d in g[: len(g) // replicas]]
    if not share:
        raise PrismError(f"replicas={replicas}: no group of twin devices has {replicas} "
                         f"members to give each replica one")
    return attempt(share)


def twin_maps(plan: Plan, devices: Sequence[DeviceConfig], wanted: int | None
              ) -> list[dict[str, str]]:
    """For each further replica, plan device -> a twin no replica uses yet."""
    used = {p.device for p in plan.partitions}
    logical = sorted(used)
    figures = {d.name: d.figures() for d in devices if d.name in used}
    free: dict[tuple, deque[DeviceConfig]] = {}  # by figures, each in canonical order
    for d in canonical_devices(devices):
        if d.name not in used:
            free.setdefault(d.figures(), deque()).append(d)
    need = Counter(figures.values())  # twins of each kind one replica takes
    maps: list[dict[str, str]] = []
    while wanted is None or len(maps) < wanted:
        if any(len(free.get(f, ())) < n for f, n in need.items()):
            break
        maps.append({name: free[figures[name]].popleft().name for name in logical})
    if wanted is not None and len(maps) < wanted:
        raise PartitionError(f"only {len(maps) + 1} replicas of {plan.network} fit: the plan "
                             f"uses {', '.join(logical)} and too few twin devices remain")
    return maps
