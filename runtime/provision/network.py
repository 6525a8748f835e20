"""A network as the provisioner loaded it (`LoadedNetwork`, frozen: what the host serves),
and placing one on devices: provisioning each replica, and rollback when any of it fails
(nothing stays loaded).

Two loaders make networks: `from_model.load_network` (an ONNX model: graph, plan,
sub-models extracted now) and `from_bundle.load_bundle` (a bundle compiled ahead of time:
the plan and programs read from the file). This module imports neither the graph IR nor
the partitioner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.devices.device import Device, Program
from runtime.errors import DeviceSpecError
from runtime.executor.checks import OutputCheck
from runtime.executor.executor import Executor, LoadedPartition
from runtime.inputs import InputSpec, Signature
from runtime.partition.plan import Plan
from runtime.partition.steps import Step
from runtime.provision.provisioner import provision, twin_groups, unload
from runtime.types import BatchingConfig

if TYPE_CHECKING:
    from runtime.bundle.placed import LoadedBundle
    from runtime.cost.model import CostModel
    from runtime.graph import Graph


@dataclass(frozen=True)
class Replanning:
    """How a network loaded from a model on measured costs plans again on other costs
    (`replan`: its steps and plan) and lays a plan on its devices beside what is loaded
    (`lay(plan, tag)`: every replica, under keys `tag` tells apart): what the host's
    learner (runtime/host/learning.py) needs to re-plan it while it serves."""

    replan: Callable[[CostModel], tuple[list[Step], Plan]]
    lay: Callable[[Plan, str], LoadedNetwork]


@dataclass(frozen=True, eq=False)
class LoadedNetwork:
    """A network on its devices: its plan, its face (inputs and outputs), each replica's
    loaded partitions and executor, and the serving settings it was loaded with."""

    name: str
    plan: Plan
    face: Signature
    loaded: tuple[tuple[LoadedPartition, ...], ...]  # per replica
    replicas: tuple[Executor, ...]
    batching: BatchingConfig | None = None
    # the graph, or how to load it when first asked (a bundle's network.onnx)
    graph_source: Graph | Callable[[], Graph] | None = None
    bundle: LoadedBundle | None = None  # the bundle it was loaded from, if it was
    replanning: Replanning | None = None  # how it plans again while it serves, if it may
    _graph: list[Graph] = field(default_factory=list, repr=False)  # loaded when asked
    _graph_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def specs(self) -> list[InputSpec]:
        """What it takes as feeds."""
        return self.face.inputs

    @property
    def lean(self) -> Executor | None:
        """The replica a request may run on with no request record (the host's lean path):
        the only one, unbatched, of one partition that reads the inputs and makes the
        outputs."""
        if self.batching is None and len(self.replicas) == 1 and self.replicas[0].single:
            return self.replicas[0]
        return None

    @property
    def graph(self) -> Graph:
        """The whole network's graph; a bundle's is loaded when first asked for."""
        with self._graph_lock:
            if not self._graph:
                source = self.graph_source
                graph = source() if callable(source) else source
                assert graph is not None, f"{self.name} was loaded without its graph"
                self._graph.append(graph)
            return self._graph[0]

    @property
    def stages(self) -> int:
        """Partitions over every replica: how many batches can be at work at once."""
        return sum(max(1, len(replica.parts)) for replica in self.replicas)


def publish_plan(bus: Any, name: str, steps: Sequence[Step], plan: Plan) -> None:
    """Every step as `partition.step`, then `partition.planned` (nothing without a
    subscriber)."""
    if not bus.active:
        return
    for step in steps:
        bus.publish("partition.step", network=name, index=step.index, step=step.kind,
                    reason=step.reason, partition=step.partition, device=step.device,
                    nodes=list(step.nodes))
    bus.publish("partition.planned", network=name, mode=plan.mode,
                bottleneck_seconds=plan.bottleneck_seconds,
                lower_bound_seconds=plan.lower_bound_seconds, costs=plan.costs,
                partitions=[{"name": p.name, "device": p.device, "nodes": len(p.nodes),
                             "est_seconds": p.est_seconds} for p in plan.partitions])


def place_replicas(name: str, plan: Plan, made: Mapping[str, Program],
                   devices: Mapping[str, Device], bus: Any,
                   twin_sets: Sequence[Mapping[str, str] | None], face: Signature,
                   graph: Graph | None = None, tag: str = ""
                   ) -> tuple[tuple[tuple[LoadedPartition, ...], ...], tuple[Executor, ...]]:
    """Provision `made` (partition -> program) once per replica (`twin_sets`: per replica,
    plan device -> its twin, None for the plan's own devices) and make each replica's
    executor, checking partition outputs against `graph` when there is one (else only
    that they are there); `tag` marks every key (a second plan of the network loaded
    beside its first); raises with nothing left loaded."""
    loaded: list[tuple[LoadedPartition, ...]] = []
    groups = twin_groups(devices.values())
    try:
        for r, onto in enumerate(twin_sets):
            loaded.append(tuple(provision(plan, made, devices, network=name,
                                          tag=f"{tag}#{r}" if r else tag, bus=bus, onto=onto,
                                          groups=groups)))
    except BaseException:
        unload_replicas(name, loaded, bus)
        raise
    return tuple(loaded), tuple(Executor(face, replica, name, bus, None if graph is None else [
        OutputCheck.of(graph, lp.partition.outputs) for lp in replica]) for replica in loaded)


def free_bytes(devices: Mapping[str, Device]) -> dict[str, int]:
    """Device -> the bytes free now, for each device other networks already use: what a
    new network's plan may fill. Counting the new network's activations on top of the
    arena a device already has is conservative (a device shares one arena among its
    programs), so what the plan fits, the device takes."""
    return {d.name: d.free_bytes for d in devices.values() if d.used_bytes}


def as_loaded(plan: Plan, replica: Sequence[LoadedPartition],
              devices: Mapping[str, Device]) -> Plan:
    """The plan naming the devices its first replica's partitions were loaded on (a
    provisioner finding a planned device full loads onto a twin), each with its own
    configuration (its whole memory, not what was free when the plan was made)."""
    where = {lp.partition.name: lp.device.name for lp in replica}
    return plan.moved(where, {name: devices[name].config for name in {
        *where.values(), *(d.name for d in plan.devices if d.name in devices)}})


def device_pool(devices: Mapping[str, Device], names: Sequence[str]) -> dict[str, Device]:
    """The named ones of a host's devices, for a network confined to them."""
    unknown = [n for n in names if n not in devices]
    if unknown or not names:
        what = f"no device named {unknown[0]!r}" if unknown else "no devices were named"
        raise DeviceSpecError(f"{what}: this host has {', '.join(sorted(devices))}")
    return {n: devices[n] for n in dict.fromkeys(names)}


def unload_network(net: LoadedNetwork, bus: Any) -> None:
    """Unload every replica, then let go of the bundle file it was loaded from, if any."""
    unload_replicas(net.name, net.loaded, bus)
    if net.bundle is not None:
        net.bundle.close()


def unload_replicas(name: str, loaded: Sequence[Sequence[LoadedPartition]], bus: Any
                    ) -> None:
    """Unload every loaded replica of network `name`."""
    for replica in loaded:
        unload(replica, network=name, bus=bus)
