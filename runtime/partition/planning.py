"""The plan `HostManager.add_network` makes for a network: its mode or map, placement
options, replicas (one replica's share of the devices) and the cost model it is made
with. `prism compile` and `prism partition` plan with it, so a bundle holds the same plan
the host would make.

Costs are measured by default (`costs="measured"`, or `$PRISM_COSTS`): devices that run
onnxruntime on the CPU (`cpu`, `ray`) get each node's time timed on this machine
(`measure.measure_nodes`), from the cache when an earlier load measured the same network
on the same kind of device (`cost/cache.py`), so only the first load pays; a first
measurement is then checked against the plan's own partitions, timed one by one, and the
plan made again on the corrected times until it no longer changes (`REFINE_ROUNDS` at
most) before the times are cached. `costs="model"` keeps the roofline; a `CostModel`
(the times a running plan showed, say) is used as given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runtime.cost import COSTS, CostModel, Timings, kind_of
from runtime.cost.cache import TimingsCache
from runtime.devices.config import DeviceConfig
from runtime.errors import PrismError
from runtime.graph import Graph
from runtime.partition import MODES, Plan, partition_steps
from runtime.partition.measure import (
    Feeds,
    Progress,
    measure_nodes,
    refined,
    time_partitions,
)
from runtime.partition.partitioner import fitted
from runtime.partition.record import finish, tap
from runtime.partition.replicas import planned_over
from runtime.partition.steps import Step

PartitionSpec = str | Path | Mapping  # a mode, or a user map (file or mapping)
CostsSpec = str | CostModel  # "measured", "model", or a model to use as it is
COSTS_ENV = "PRISM_COSTS"  # the default when `costs` is not given
REFINE_ROUNDS = 3


def default_costs() -> str:
    chosen = os.environ.get(COSTS_ENV, "measured")
    if chosen not in COSTS:
        raise PrismError(f"${COSTS_ENV} must be one of {', '.join(COSTS)}, got {chosen!r}")
    return chosen


def checked_costs(costs: CostsSpec | None) -> CostsSpec:
    """`costs` as given, the default for None; a one-line error for anything else."""
    if costs is None:
        return default_costs()
    if isinstance(costs, CostModel) or costs in COSTS:
        return costs
    raise PrismError(f"costs must be one of {', '.join(COSTS)} (or a CostModel), got "
                     f"{costs!r}")


def measured_model(graph: Graph, devices: Sequence[DeviceConfig],
                   hops: Mapping[str, float] | None = None,
                   on_progress: Progress | None = None, cache: TimingsCache | None = None,
                   measure: bool = True, sample_feeds: Feeds | None = None
                   ) -> tuple[CostModel, list[str]]:
    """The measured cost model for these devices and the kinds measured just now (the
    others came from the cache, or stay on the roofline when they cannot be measured;
    `measure=False`: the cache's times only; `sample_feeds`: to time it on)."""
    cache = cache or TimingsCache()
    timings: dict[str, Timings] = {}
    fresh, tried = [], set()
    for device in devices:
        kind = kind_of(device)
        if kind is None or kind in tried:
            continue
        tried.add(kind)
        known = cache.get(graph, kind)
        if known is None and measure:
            known = measure_nodes(graph, device, on_progress, sample_feeds)
            if known is not None:
                fresh.append(kind)
        if known is not None:
            timings[kind] = known
    hops = dict(hops) if hops is not None else cpu_hops(devices, cache) if timings else {}
    return CostModel(CostModel.roofline(graph).costs, timings, hops), fresh


def cpu_hops(devices: Sequence[DeviceConfig], cache: TimingsCache | None = None
             ) -> dict[str, float]:
    """The dispatch cost of in-process `cpu` devices (`{"cpu": seconds}`, or {} without
    one): from the cache, else measured on two opened for it and cached."""
    from runtime.devices.hop import process_hop

    cpu = next((d for d in devices if d.backend == "cpu"), None)
    if cpu is None:
        return {}
    cache, kind = cache or TimingsCache(), kind_of(cpu) or "cpu"
    hop = cache.get_hop(kind)
    if hop is None:
        hop = process_hop(cpu.threads, cpu.spin)
        if hop is not None:
            cache.put_hop(kind, hop)
    return {} if hop is None else {"cpu": hop}


@dataclass
class Planned:
    """A plan, the steps that made it, the cost model it was made with, the device kinds
    measured for it just now (their times are not cached yet: `store`), and how to plan
    again on other costs (`replan`)."""

    steps: list[Step]
    plan: Plan
    model: CostModel
    fresh: list[str]
    replan: Callable[[CostModel], tuple[list[Step], Plan]]
    cache: TimingsCache

    def store(self, graph: Graph) -> None:
        """Keep what was measured for the next load."""
        for kind in self.fresh:
            self.cache.put(graph, kind, self.model.timings[kind])


def plan_network(graph: Graph, devices: Sequence[DeviceConfig],
                 partition: PartitionSpec = "balanced", **options: Any
                 ) -> tuple[list[Step], Plan]:
    """The plan and the partitioner's steps that made it (`make_plan`, with what it
    measured cached)."""
    made = make_plan(graph, devices, partition, **options)
    made.store(graph)
    return made.steps, made.plan


def make_plan(graph: Graph, devices: Sequence[DeviceConfig],
              partition: PartitionSpec = "balanced", *,
              annotations: str | Path | Mapping | None = None, fallback: str | None = None,
              replicas: int | str = 1, on_step: Callable[[Step], None] | None = None,
              costs: CostsSpec | None = None, hops: Mapping[str, float] | None = None,
              on_progress: Progress | None = None, cache: TimingsCache | None = None,
              free: Mapping[str, int] | None = None, sample_feeds: Feeds | None = None
              ) -> Planned:
    """The plan, the partitioner's steps that made it and its cost model. A replica
    search may try several device sets: `on_step` sees every step of every try (for
    progress), the steps returned are the kept plan's. `hops`: measured dispatch seconds
    by backend (a host measures its own devices'); `on_progress(what, done, total)` hears
    about measuring. `free`: device -> bytes it has free (other networks loaded): a mode's
    plan fits those (a user's map puts partitions where it says; a provisioner finding
    the device full uses a twin), and names the devices with their own configurations.
    `sample_feeds`: one request's feeds to measure on, where they have the bound shapes."""
    if isinstance(partition, str) and partition in MODES:
        mode, user_map = partition, None
    else:
        mode, user_map = "user", partition
    costs = checked_costs(costs)
    cache = cache or TimingsCache()
    room_for = dict(free or {}) if mode != "user" else {}
    fresh: list[str] = []
    if isinstance(costs, CostModel):
        model = costs
    elif costs == "model":
        model = CostModel.roofline(graph)
    else:  # what no plan could be is said before measuring: a node no device runs, or one
        # too large for every device (measuring runs it, at that size, on this machine)
        fitted(graph, _in_room(devices, room_for), annotations, fallback)
        model, fresh = measured_model(graph, devices, hops, on_progress, cache,
                                      sample_feeds=sample_feeds)

    def attempt(some: list[DeviceConfig], model: CostModel) -> tuple[list[Step], Plan]:
        steps: list[Step] = []

        def keep(step: Step) -> None:
            steps.append(step)
            if on_step is not None:
                on_step(step)

        plan = finish(tap(partition_steps(graph, _in_room(some, room_for), mode, user_map=user_map,
                                          annotations=annotations, fallback=fallback,
                                          costs=model), keep))
        return steps, replace(plan, devices=list(some))

    def planned(model: CostModel) -> tuple[list[Step], Plan]:
        return planned_over(list(devices), replicas, lambda some: attempt(some, model), graph,
                            model)

    steps, plan = planned(model)
    if fresh:
        steps, plan, model = _refine(graph, model, steps, plan, planned, on_progress,
                                     sample_feeds)
    return Planned(steps, plan, model, fresh, planned, cache)


def _in_room(devices: Sequence[DeviceConfig], room_for: Mapping[str, int]
             ) -> list[DeviceConfig]:
    """The devices, each with the memory it has free where that is less than its own."""
    return [replace(d, memory_bytes=max(1, room_for[d.name]))
            if room_for.get(d.name, d.memory_bytes) < d.memory_bytes else d for d in devices]


def live_costs(graph: Graph, plan: Plan, seconds: Mapping[str, float],
               hops: Mapping[str, float] | None = None, cache: TimingsCache | None = None
               ) -> CostModel:
    """The cost model a running plan's own run times make: each partition's nodes scaled
    so that, with its fixed run cost, they sum to the (median) seconds its runs took
    (`seconds`: partition -> run time); nodes of partitions that have not run keep the
    times this machine's cache has for them (or the roofline's); devices of a modelled
    kind (`sim`) keep their model. Re-planning with it moves work off the stages that
    ran slower than planned. `hops`: as for `plan_network` (default: measured here)."""
    base, _ = measured_model(graph, plan.devices, {}, cache=cache, measure=False)
    roofline = CostModel.roofline(graph)
    timings = dict(base.timings)
    for device in plan.devices:
        kind = kind_of(device)
        if kind is not None and kind not in timings:
            timings[kind] = Timings({n.name: roofline.node_seconds(n.name, device)
                                     for n in graph.nodes})
    hops = dict(hops) if hops is not None else cpu_hops(plan.devices, cache)
    scaled = refined(CostModel(base.costs, timings, hops), plan, seconds)
    return CostModel(scaled.costs, {kind: Timings(t.nodes, t.run_seconds, "live")
                                    for kind, t in scaled.timings.items()}, scaled.hops)


def same_assignment(a: Plan, b: Plan) -> bool:
    """Do the plans put the same nodes on the same devices, partition by partition?"""
    return _assignment(a) == _assignment(b)


def _assignment(plan: Plan) -> list[tuple[str, tuple[str, ...]]]:
    return [(p.device, p.nodes) for p in plan.partitions]


def _refine(graph: Graph, model: CostModel, steps: list[Step], plan: Plan,
            planned: Callable[[CostModel], tuple[list[Step], Plan]],
            on_progress: Progress | None, sample_feeds: Feeds | None
            ) -> tuple[list[Step], Plan, CostModel]:
    """Time the plan's own partitions, correct the node times to what they measured, and
    plan again, until the plan no longer changes (or REFINE_ROUNDS)."""
    for _ in range(REFINE_ROUNDS):
        measured = time_partitions(graph, plan, on_progress, sample_feeds)
        if not measured:
            break
        model = refined(model, plan, measured)
        again, replanned = planned(model)
        settled = _assignment(replanned) == _assignment(plan)
        steps, plan = again, replanned
        if settled:
            break
    return steps, plan, model
