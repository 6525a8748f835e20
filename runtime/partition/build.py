"""Building a Plan from a grouping of a graph's nodes: the partition DAG in topological
order, the transfers between devices, each partition's bytes and times, the arenas."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from runtime.cost import CostModel
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.liveness import (
    leaves,
    peak_activation_bytes,
    weight_bytes,
    weight_names,
)
from runtime.partition.memory_plan import device_peak_bytes
from runtime.partition.plan import Partition, Plan, Transfer, device_busy
from runtime.precision import node_precisions


def build_plan(graph: Graph, model: CostModel, devices: Sequence[DeviceConfig],
               groups: Sequence[tuple[str, str, Sequence[str]]], *, mode: str,
               order: Sequence[str], reasons: dict[str, str] | None = None) -> Plan:
    """A Plan from (partition name, device name, node names); partitions run nodes in `order`."""
    by_device = {d.name: d for d in devices}
    position = {name: i for i, name in enumerate(order)}
    home: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for pname, _, names in groups:
        members[pname] = sorted(names, key=position.__getitem__)
        home.update(dict.fromkeys(names, pname))
    device_of = {pname: dname for pname, dname, _ in groups}
    pdag = nx.DiGraph()
    pdag.add_nodes_from(members)
    # partitions wait for what they take as inputs: not a weight they make as they load
    for src, dst, tensors in graph.dag.edges(data="tensors"):
        if home[src] != home[dst] and not all(map(graph.is_constant, tensors)):
            pdag.add_edge(home[src], home[dst])
    try:
        topo = list(nx.lexicographical_topological_sort(
            pdag, key=lambda p: min(position[n] for n in members[p]) if members[p] else -1))
    except nx.NetworkXUnfeasible:
        cycle = " -> ".join(a for a, _ in nx.find_cycle(pdag))
        raise PartitionError(f"partitions depend on each other in a cycle: {cycle}") from None

    # Each copy charges each device its own end (cost.transfer_seconds): the receiving
    # device once per tensor, on the first of its partitions to read it; the sending
    # device once per tensor however many devices read it, on the partition making it.
    # A tensor made from weights alone is never copied: a partition reading it from
    # another holds it, made as it loads (`submodel.weights_of`).
    transfers: list[Transfer] = []
    incoming: dict[str, float] = dict.fromkeys(members, 0.0)
    outgoing: dict[str, float] = dict.fromkeys(members, 0.0)
    for pname in topo:
        src = by_device[device_of[pname]]
        for n in members[pname]:
            for t in graph.node(n).writes:
                if graph.is_constant(t):
                    continue
                readers = [home[c] for c in graph.consumers.get(t, ()) if home[c] != pname]
                size = graph.tensor_bytes(t)
                away = dict.fromkeys(device_of[r] for r in readers if device_of[r] != src.name)
                for dname in away:
                    dsts = tuple(dict.fromkeys(r for r in readers if device_of[r] == dname))
                    dst = by_device[dname]
                    transfers.append(Transfer(t, src.name, dname, size,
                                              model.transfer_seconds(size, src, dst), pname,
                                              dsts))
                    incoming[min(dsts, key=topo.index)] += model.receive_seconds(size, dst)
                if away:
                    outgoing[pname] += model.send_seconds(size, src)

    partitions = []
    for pname in topo:
        nodes = [graph.node(n) for n in members[pname]]
        dev = by_device[device_of[pname]]
        made = {t for n in nodes for t in n.writes}
        inside = set(members[pname])
        inputs = dict.fromkeys(t for n in nodes for t in n.reads
                               if t not in made and not graph.is_constant(t))
        outputs = dict.fromkeys(t for n in nodes for t in n.writes if leaves(graph, t, inside))
        partitions.append(Partition(
            name=pname, nodes=tuple(members[pname]), device=dev.name, backend=dev.backend,
            inputs=tuple(inputs), outputs=tuple(outputs),
            weights=tuple(weight_names(graph, nodes)),
            weight_bytes=weight_bytes(graph, nodes),
            activation_bytes=peak_activation_bytes(graph, nodes),
            est_seconds=model.run_seconds(dev) + sum(model.node_seconds(n.name, dev)
                                                     for n in nodes),
            transfer_in_seconds=incoming[pname] + model.hop_seconds(dev),
            flops=sum(model.costs[n.name].flops for n in nodes),
            transfer_out_seconds=outgoing[pname]))
    busy = device_busy(partitions, (d.name for d in devices))
    arenas = {d: device_peak_bytes(partitions, graph, d) for d in {p.device for p in partitions}}
    return Plan(network=graph.name, mode=mode, devices=list(devices), partitions=partitions,
                transfers=transfers, bottleneck_seconds=max(busy.values(), default=0.0),
                device_seconds=busy, order=tuple(order), reasons=dict(reasons or {}),
                arenas=arenas, precisions=dict(node_precisions(graph)))
