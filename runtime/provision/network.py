"""A network as the host holds it, and placing one on devices: provisioning each replica,
and rollback when any of it fails (nothing stays loaded).

Two loaders make networks, both light to reach from the host: `jit.load_network` (an ONNX
model: graph, plan, sub-models extracted now) and `bundle.load.load_bundle` (a bundle
compiled ahead of time: the plan and programs read from the file). This module imports
neither the graph IR nor the partitioner.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.devices.device import Device, Program
from runtime.errors import DeviceSpecError
from runtime.executor.checks import OutputCheck
from runtime.executor.executor import Executor
from runtime.executor.requests import Request
from runtime.host.batching import Batcher, BatchingConfig
from runtime.inputs import InputSpec, Signature
from runtime.partition.plan import Plan
from runtime.partition.steps import Step
from runtime.provision.provisioner import LoadedPartition, provision, twin_groups, unload

if TYPE_CHECKING:
    from runtime.graph import Graph
    from runtime.host.lean import LeanRun
    from runtime.provision.from_bundle import LoadedBundle


@dataclass(eq=False)
class Network:
    name: str
    plan: Plan
    face: Signature
    loaded: list[list[LoadedPartition]]  # per replica
    replicas: list[Executor]
    batching: BatchingConfig | None = None
    timeout: float = math.inf  # a request's timeout when it names none (inf: none)
    # the graph, or how to load it when first asked (a bundle's network.onnx)
    graph_source: Graph | Callable[[], Graph] | None = None
    bundle: LoadedBundle | None = None  # the bundle it was loaded from, if it was
    # a token per request accepted and not yet ended (lean runs aside): appended where it
    # is accepted, popped where it ends; atomic, so a batched one needs no lock to enter
    accepted: deque[None] = field(default_factory=deque)
    removing: bool = False
    running: set[Request] = field(default_factory=set)
    batcher: Batcher | None = None
    lean: Executor | None = None  # the replica a request may run on with no Request record
    lean_run: LeanRun | None = None  # the lean path, set by the host (runtime/lean.py)
    # a token per lean run in flight: deque's append and pop are atomic, no lock needed
    lean_runs: deque[None] = field(default_factory=deque)
    _graph_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.specs: list[InputSpec] = self.face.inputs  # what it takes as feeds
        if self.batching is None and len(self.replicas) == 1 and self.replicas[0].single:
            self.lean = self.replicas[0]

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet ended, lean runs included."""
        return len(self.accepted) + len(self.lean_runs)

    @property
    def graph(self) -> Graph:
        """The whole network's graph; a bundle's is loaded when first asked for."""
        with self._graph_lock:
            if callable(self.graph_source):
                self.graph_source = self.graph_source()
            assert self.graph_source is not None
            return self.graph_source

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
                partitions=[{"name": p.name, "device": p.device, "nodes": len(p.nodes),
                             "est_seconds": p.est_seconds} for p in plan.partitions])


def place(name: str, plan: Plan, made: Mapping[str, Program], devices: Mapping[str, Device],
          bus: Any, twin_sets: Sequence[Mapping[str, str] | None], face: Signature,
          graph: Graph | None = None) -> tuple[list[list[LoadedPartition]], list[Executor]]:
    """Provision `made` (partition -> program) once per replica (`twin_sets`: per replica,
    plan device -> its twin, None for the plan's own devices) and make each replica's
    executor, checking partition outputs against `graph` when there is one (else only
    that they are there); raises with nothing left loaded."""
    loaded: list[list[LoadedPartition]] = []
    groups = twin_groups(devices.values())
    try:
        for r, onto in enumerate(twin_sets):
            loaded.append(provision(plan, made, devices, network=name, tag=f"#{r}" if r else "",
                                    bus=bus, onto=onto, groups=groups))
    except BaseException:
        _unload(name, loaded, bus)
        raise
    return loaded, [Executor(face, replica, name, bus, None if graph is None else [
        OutputCheck.of(graph, lp.partition.outputs) for lp in replica]) for replica in loaded]


def device_pool(devices: Mapping[str, Device], names: Sequence[str]) -> dict[str, Device]:
    """The named ones of a host's devices, for a network confined to them."""
    unknown = [n for n in names if n not in devices]
    if unknown or not names:
        what = f"no device named {unknown[0]!r}" if unknown else "no devices were named"
        raise DeviceSpecError(f"{what}: this host has {', '.join(sorted(devices))}")
    return {n: devices[n] for n in dict.fromkeys(names)}


def unload_network(net: Network, bus: Any) -> None:
    """Unload every replica, then let go of the bundle file it was loaded from, if any."""
    _unload(net.name, net.loaded, bus)
    if net.bundle is not None:
        net.bundle.close()


def _unload(name: str, loaded: list[list[LoadedPartition]], bus: Any) -> None:
    for replica in loaded:
        unload(replica, network=name, bus=bus)
