"""Loading a network just in time: an ONNX model loaded, planned (every step published),
each partition extracted into a program, and provisioned onto the devices.

The plan is made against the memory each device has free (`network.free_bytes`), with
the cost model asked for: measured by default, for which the host's own devices' dispatch
is timed (`hops.device_hops`); the first load of a network reports its measuring as
`cost.measure` events, and checks the loaded plan under load (`calibrate`) before what it
measured is cached."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx

from runtime.devices.device import Device, Program
from runtime.executor.executor import Executor, LoadedPartition
from runtime.graph import Graph, load_graph
from runtime.inputs import Signature, bound_to_feeds, signature
from runtime.partition.measure import Feeds, calibration_feeds, refined
from runtime.partition.plan import Partition, Plan
from runtime.partition.planning import (
    CostsSpec,
    PartitionSpec,
    Planned,
    checked_costs,
    make_plan,
    same_assignment,
)
from runtime.partition.replicas import further, twin_maps
from runtime.partition.submodel import held_extract
from runtime.provision.calibrate import ROUNDS, bounded, loaded_medians
from runtime.provision.hops import device_hops
from runtime.provision.network import (
    LoadedNetwork,
    Replanning,
    as_loaded,
    free_bytes,
    place_replicas,
    publish_plan,
    unload_replicas,
)
from runtime.provision.provisioner import one_line_errors
from runtime.types import BatchingConfig, check_batchable

ModelSource = str | Path | bytes | onnx.ModelProto | Graph  # a Graph: loaded already
Placed = tuple[tuple[tuple[LoadedPartition, ...], ...], tuple[Executor, ...]]


class Programs(Mapping[str, Program]):
    """partition name -> its program: the sub-model, its weights (large ones held beside
    it as it is made: not copied into it first), the device's arena (the peak of its
    memory plan) and the stage time a modelled device is held for. Each is made when it is
    asked for, so a load holds one partition's copy of the weights at a time, not all of
    them; `keep` keeps each, for a load of several replicas."""

    def __init__(self, graph: Graph, plan: Plan, keep: bool = False):
        self.graph, self.plan = graph, plan
        self.parts = {p.name: p for p in plan.partitions}
        self.kept: dict[str, Program] | None = {} if keep else None

    def __getitem__(self, name: str) -> Program:
        if self.kept is not None and name in self.kept:
            return self.kept[name]
        part = self.parts[name]
        with one_line_errors(self.plan.network):
            made = _program(self.graph, part, self.plan.arenas[part.device])
        if self.kept is not None:
            self.kept[name] = made
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)


def _program(graph: Graph, partition: Partition, arena: int) -> Program:
    model, held = held_extract(graph, partition)
    return Program.of(model, partition.weight_bytes, arena, partition.stage_seconds, held)


def load_network(name: str, model: ModelSource, devices: Mapping[str, Device], bus: Any, *,
                 partition: PartitionSpec = "balanced",
                 annotations: str | Path | Mapping | None = None, fallback: str | None = None,
                 replicas: int | str = 1, batching: BatchingConfig | None = None,
                 bindings: Mapping[str, int] | None = None,
                 costs: CostsSpec | None = None, sample_feeds: Feeds | None = None
                 ) -> LoadedNetwork:
    """Load, plan (publishing every step), provision each replica. Raises with nothing
    left loaded."""
    graph = load_graph(model, bindings=bindings, name=name)
    if sample_feeds is not None:
        graph, sample_feeds = bound_to_feeds(graph, sample_feeds, bindings)
    if batching is not None:
        check_batchable(graph.name, graph.declared_dims(graph.inputs),
                        graph.declared_dims(graph.outputs))
    configs = [d.config for d in devices.values()]
    costs = checked_costs(costs)
    hops = device_hops(devices) if costs == "measured" else None

    def progress(what: str, done: int, total: int) -> None:
        if bus.active:
            bus.publish("cost.measure", network=name, what=what, done=done, total=total)

    made = make_plan(graph, configs, partition, annotations=annotations, fallback=fallback,
                     replicas=replicas, costs=costs, hops=hops, on_progress=progress,
                     free=free_bytes(devices), sample_feeds=sample_feeds)
    publish_plan(bus, name, made.steps, made.plan)
    face = signature(graph)

    def place(plan: Plan, tag: str = "") -> Placed:
        twin_sets: list[Mapping[str, str] | None] = [None]  # per replica: device -> twin
        if replicas != 1:
            twin_sets += twin_maps(plan, configs, further(replicas))
        return place_replicas(name, plan, Programs(graph, plan, keep=len(twin_sets) > 1),
                              devices, bus, twin_sets, face, graph, tag)

    def lay(plan: Plan, tag: str = "", placed: Placed | None = None) -> LoadedNetwork:
        loaded, executors = placed or place(plan, tag)
        return LoadedNetwork(name, as_loaded(plan, loaded[0], devices), face, loaded,
                             executors, batching, graph_source=graph, replanning=replanning)

    # measured costs, unbatched (a batch's run times are its size's): it may learn
    replanning = Replanning(made.replan, lay) if made.plan.costs == "measured" and \
        batching is None else None
    placed = place(made.plan)
    if made.fresh:
        placed = _under_load(name, graph, made, face, *placed, place, bus, progress,
                             sample_feeds)
        made.store(graph)
    return lay(made.plan, placed=placed)


def _under_load(name: str, graph: Graph, made: Planned, face: Signature,
                loaded: tuple[tuple[LoadedPartition, ...], ...],
                executors: tuple[Executor, ...], place: Any, bus: Any, progress: Any,
                sample_feeds: Feeds | None) -> Placed:
    """Check a first-measured plan under load (`calibrate`): correct its nodes to the run
    times its partitions showed, plan again, and load the new plan in place of the old
    when it differs. `made` takes the final plan, steps and model."""
    feeds = calibration_feeds(graph, sample_feeds)
    for round_ in range(ROUNDS):
        if feeds is None:
            break
        progress(f"timing {name}'s partitions under load", round_, ROUNDS)
        try:
            medians = loaded_medians(name, loaded[0], face, feeds, bus)
        except BaseException:  # an interrupt: nothing stays loaded
            unload_replicas(name, loaded, bus)
            raise
        if medians is None:
            break
        alone = {p.name: p.est_seconds for p in made.plan.partitions}
        made.model = refined(made.model, made.plan,
                             {p: bounded(alone[p], seconds) for p, seconds in medians.items()})
        steps, plan = made.replan(made.model)
        moved = not same_assignment(plan, made.plan)
        made.steps, made.plan = steps, plan
        publish_plan(bus, name, steps, plan)
        if not moved:
            break
        unload_replicas(name, loaded, bus)
        loaded, executors = place(plan)
    progress(f"timing {name}'s partitions under load", ROUNDS, ROUNDS)
    return loaded, executors
