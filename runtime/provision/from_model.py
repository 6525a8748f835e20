"""Loading a network just in time: an ONNX model loaded, planned (every step published),
each partition extracted into a program, and provisioned onto the devices.

The plan is made against the memory each device has free (`network.free_bytes`), with
the cost model asked for: measured by default, for which the host's own devices' dispatch
is timed (`hops.device_hops`) and the first load of a network reports its measuring as
`cost.measure` events."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from runtime.devices.device import Device, Program
from runtime.graph import Graph, load_graph
from runtime.inputs import signature
from runtime.partition.plan import Plan
from runtime.partition.planning import CostsSpec, PartitionSpec, checked_costs, plan_network
from runtime.partition.replicas import further, twin_maps
from runtime.partition.submodel import extract
from runtime.provision.hops import device_hops
from runtime.provision.network import (
    LoadedNetwork,
    as_loaded,
    free_bytes,
    place_replicas,
    publish_plan,
)
from runtime.provision.provisioner import one_line_errors
from runtime.types import BatchingConfig, check_batchable

ModelSource = str | Path | bytes | onnx.ModelProto | Graph  # a Graph: loaded already


def programs(graph: Graph, plan: Plan) -> dict[str, Program]:
    """partition name -> its program: the sub-model, its weights, the device's arena (the
    peak of its memory plan) and the stage time a modelled device is held for."""
    with one_line_errors(plan.network):
        return {p.name: Program.of(extract(graph, p), p.weight_bytes, plan.arenas[p.device],
                                   p.stage_seconds) for p in plan.partitions}


def load_network(name: str, model: ModelSource, devices: Mapping[str, Device], bus: Any, *,
                 partition: PartitionSpec = "balanced",
                 annotations: str | Path | Mapping | None = None, fallback: str | None = None,
                 replicas: int | str = 1, batching: BatchingConfig | None = None,
                 bindings: Mapping[str, int] | None = None,
                 costs: CostsSpec | None = None) -> LoadedNetwork:
    """Load, plan (publishing every step), provision each replica. Raises with nothing
    left loaded."""
    graph = load_graph(model, bindings=bindings, name=name)
    if batching is not None:
        check_batchable(graph.name, graph.declared_dims(graph.inputs),
                        graph.declared_dims(graph.outputs))
    configs = [d.config for d in devices.values()]
    costs = checked_costs(costs)
    hops = device_hops(devices) if costs == "measured" else None

    def progress(what: str, done: int, total: int) -> None:
        if bus.active:
            bus.publish("cost.measure", network=name, what=what, done=done, total=total)

    steps, plan = plan_network(graph, configs, partition, annotations=annotations,
                               fallback=fallback, replicas=replicas, costs=costs, hops=hops,
                               on_progress=progress, free=free_bytes(devices))
    publish_plan(bus, name, steps, plan)
    twin_sets: list[Mapping[str, str] | None] = [None]  # per replica: plan device -> twin
    if replicas != 1:
        twin_sets += twin_maps(plan, configs, further(replicas))
    face = signature(graph)
    loaded, executors = place_replicas(name, plan, programs(graph, plan), devices, bus,
                                       twin_sets, face, graph)
    return LoadedNetwork(name, as_loaded(plan, loaded[0], devices), face, loaded, executors,
                         batching, graph_source=graph)
