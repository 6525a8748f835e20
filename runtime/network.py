"""A network as the host holds it, and loading one: graph, plan, replicas, provisioning,
and rollback when any of it fails (nothing stays loaded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from runtime.batching import Batcher, BatchingConfig, check_batchable
from runtime.devices.device import Device
from runtime.errors import DeviceSpecError
from runtime.executor import Executor
from runtime.graph import Graph, load_graph
from runtime.inputs import InputSpec, input_specs
from runtime.partition import Plan
from runtime.planning import PartitionSpec, plan_network
from runtime.provision import LoadedPartition, programs, provision, unload
from runtime.replicas import twin_maps
from runtime.requests import Request

ModelSource = str | Path | bytes | onnx.ModelProto | Graph  # a Graph: loaded already


@dataclass(eq=False)
class Network:
    name: str
    graph: Graph
    plan: Plan
    specs: list[InputSpec]
    loaded: list[list[LoadedPartition]]  # per replica
    replicas: list[Executor]
    batching: BatchingConfig | None = None
    timeout: float = math.inf  # a request's timeout when it names none (inf: none)
    outstanding: int = 0  # accepted and not yet ended
    removing: bool = False
    running: set[Request] = field(default_factory=set)
    batcher: Batcher | None = None
    lean: Executor | None = None  # the replica a request may run on with no Request record

    def __post_init__(self) -> None:
        if self.batching is None and len(self.replicas) == 1 and self.replicas[0].single:
            self.lean = self.replicas[0]

    @property
    def stages(self) -> int:
        """Partitions over every replica: how many batches can be at work at once."""
        return sum(max(1, len(replica.parts)) for replica in self.replicas)


def load_network(name: str, model: ModelSource, devices: Mapping[str, Device], bus: Any, *,
                 partition: PartitionSpec = "balanced",
                 annotations: str | Path | Mapping | None = None, fallback: str | None = None,
                 replicas: int | str = 1, batching: BatchingConfig | None = None,
                 bindings: Mapping[str, int] | None = None) -> Network:
    """Load, plan (publishing every step), provision each replica. Raises with nothing
    left loaded."""
    graph = load_graph(model, bindings=bindings, name=name)
    if batching is not None:
        check_batchable(graph)
    configs = [d.config for d in devices.values()]
    steps, plan = plan_network(graph, configs, partition, annotations=annotations,
                               fallback=fallback, replicas=replicas)
    if bus.active:
        for step in steps:
            bus.publish("partition.step", network=name, index=step.index, step=step.kind,
                        reason=step.reason, partition=step.partition, device=step.device,
                        nodes=list(step.nodes))
        bus.publish("partition.planned", network=name, mode=plan.mode,
                    bottleneck_seconds=plan.bottleneck_seconds,
                    partitions=[{"name": p.name, "device": p.device, "nodes": len(p.nodes),
                                 "est_seconds": p.est_seconds} for p in plan.partitions])
    twin_sets: list[dict[str, str] | None] = [None]  # per replica: plan device -> its twin
    if replicas != 1:
        twin_sets += twin_maps(plan, configs, None if replicas == "saturate" else int(replicas) - 1)
    made = programs(graph, plan)
    loaded: list[list[LoadedPartition]] = []
    try:
        for r, onto in enumerate(twin_sets):
            loaded.append(provision(plan, made, devices, network=name, tag=f"#{r}" if r else "",
                                    bus=bus, onto=onto))
    except BaseException:
        unload_network(name, loaded, bus)
        raise
    return Network(name, graph, plan, input_specs(graph), loaded,
                   [Executor(graph, replica, name, bus) for replica in loaded], batching)


def device_pool(devices: Mapping[str, Device], names: Sequence[str]) -> dict[str, Device]:
    """The named ones of a host's devices, for a network confined to them."""
    unknown = [n for n in names if n not in devices]
    if unknown or not names:
        what = f"no device named {unknown[0]!r}" if unknown else "no devices were named"
        raise DeviceSpecError(f"{what}: this host has {', '.join(sorted(devices))}")
    return {n: devices[n] for n in dict.fromkeys(names)}


def unload_network(name: str, loaded: list[list[LoadedPartition]], bus: Any) -> None:
    for replica in loaded:
        unload(replica, network=name, bus=bus)
