"""Replication (Glow's saturateHost): whole replicas of a plan on free twin devices.

With `replicas=N` the plan is made over the first 1/N of the devices (in canonical
order) and placed N-1 more times onto twins: devices with the same figures. With
"saturate" the plan uses the fewest devices it fits on, and is placed onto as many twin
groups as remain. With "auto" each device count is planned and the plan kept is the one
whose replicas serve the most requests a second by the cost model: as many replicas as
twins allow over 1 / bottleneck each. On equal devices a network that fits one device is
replicated (a pipeline only adds copies and uneven stages to the same work); a pipeline
is kept where it models faster (devices of different kinds) or where nothing smaller fits.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError, PrismError
from runtime.partition import Plan, canonical_devices

if TYPE_CHECKING:  # a bundle places replicas with no graph IR loaded
    from runtime.cost import CostModel
    from runtime.graph import Graph

S = TypeVar("S")  # what an attempt returns beside its plan (the steps)
FILL = ("saturate", "auto")  # as many replicas as twin devices allow


def further(replicas: int | str) -> int | None:
    """Replicas to place beyond the plan's own: a number, or None for as many as fit."""
    return None if replicas in FILL else int(replicas) - 1


def planned_over(devices: Sequence[DeviceConfig], replicas: int | str,
                 attempt: Callable[[list[DeviceConfig]], tuple[S, Plan]], graph: Graph,
                 costs: CostModel | None = None) -> tuple[S, Plan]:
    """Plan one replica: `attempt(some devices)` plans on them (returning its steps and the
    plan), or raises PartitionError. "saturate" tries the fewest devices first and keeps
    the first plan that fits, so each device count is planned once; "auto" keeps the
    fastest (`fastest`); N shares every group of twins N ways."""
    if replicas == 1:
        return attempt(list(devices))
    ordered = canonical_devices(devices)
    if replicas == "auto":
        return fastest(ordered, attempt, graph, costs)
    if replicas == "saturate":
        for k in range(1, len(ordered)):
            try:
                return attempt(ordered[:k])
            except PartitionError:
                continue
        return attempt(ordered)  # all of them: its error, if any, is the one to tell
    if not isinstance(replicas, int) or replicas < 1:
        raise PrismError(f"replicas must be a whole number >= 1, 'saturate' or 'auto', got "
                         f"{replicas!r}")
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


def fastest(ordered: list[DeviceConfig],
            attempt: Callable[[list[DeviceConfig]], tuple[S, Plan]], graph: Graph,
            costs: CostModel | None = None) -> tuple[S, Plan]:
    """Of the plans over the first k canonical devices, k = 1..n, the one whose replicas
    (as many as twins allow) model the most requests a second; ties go to fewer devices a
    replica. A device count is skipped when even a perfect split could not win: k
    devices never run a replica faster than the graph's time on the fastest device for
    each node, divided by k, and at most n // k replicas fit. `costs`: the model the plans
    are made with (default: the roofline)."""
    from runtime.cost import CostModel

    model = costs or CostModel.roofline(graph)
    floor = sum(min(model.node_seconds(n.name, d) for d in ordered)
                for n in graph.nodes)  # whole graph
    best: tuple[float, tuple[S, Plan]] | None = None
    error: PartitionError | None = None
    for k in range(1, len(ordered) + 1):
        if best is not None and (len(ordered) // k) * k / max(floor, 1e-12) <= best[0]:
            continue
        try:
            made = attempt(ordered[:k])
        except PartitionError as exc:
            error = exc
            continue
        plan = made[1]
        rate = (1 + len(twin_maps(plan, ordered, None))) / max(plan.bottleneck_seconds, 1e-12)
        if best is None or rate > best[0]:
            best = (rate, made)
    if best is None:  # nothing fits: the error of the plan over every device
        raise error or PartitionError("no devices to plan on")
    return best[1]


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
