"""A lower bound on the bottleneck: no split of the graph over the devices beats it.

Relaxations, each valid for any assignment of nodes to devices, contiguous or not, with
the cost model the plan was made with:

- **work**: every node costs at least its time on the fastest device placement allows
  it, W in all; a plan using j >= 2 devices also copies at least one activation if the
  nodes are connected through activations (graph inputs, weights and tensors made from
  weights alone are no copies, so independent branches may split without one): the
  cheapest crossing, the fewest bytes any tensor carries at the cheapest receiving end.
  The devices are busy at least W + that, and the busiest of k at least a k-th of it,
  plus the fixed cost every partition run pays (the least any device has).
- **confined work**: the nodes placement allows only on some set S of the devices run
  there, each at least as long as on the fastest of S; the busiest of S is busy at least
  a |S|-th of that, plus the least fixed cost in S (for S each set placement allows).
- **largest node**: the slowest node on its fastest allowed device, plus that device's
  fixed cost per run, runs in some stage whole.
- **one device**: a plan on one device copies nothing; its time is the whole graph's
  there. The bound is the lesser of the best such plan (where one device can hold and
  run everything) and the split bound (the larger of the two above).

`Plan.gap` is how far a plan is above its bound, as a share of the bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from runtime.cost import CostModel
from runtime.devices.config import DeviceConfig
from runtime.graph import Graph
from runtime.partition.liveness import peak_activation_bytes, weight_bytes
from runtime.partition.placement import confined_groups
from runtime.units import human_seconds


@dataclass(frozen=True)
class Bound:
    """The bound and what made it (seconds each)."""

    seconds: float
    work: float  # (W + the cheapest copy) / k + fixed: any plan using two devices or more
    largest: float  # the slowest node where it is fastest, with its run's fixed cost
    largest_node: str
    whole: float | None  # the best plan on one device (None: no device holds it all)
    devices: int
    confined: float = 0.0  # the work only some devices may run, over them
    confined_to: tuple[str, ...] = ()

    def why(self) -> str:
        """The bound in words, for the stepper."""
        parts = [f"work over {self.devices} device{'s' * (self.devices != 1)} "
                 f"{human_seconds(self.work)}",
                 f"largest node {self.largest_node} {human_seconds(self.largest)}"]
        if self.confined > self.work:
            parts.append(f"work only {', '.join(self.confined_to)} may run "
                         f"{human_seconds(self.confined)}")
        if self.whole is not None:
            parts.append(f"all on one device {human_seconds(self.whole)}")
        return "; ".join(parts)


def lower_bound(graph: Graph, model: CostModel, devices: Sequence[DeviceConfig],
                allowed: Mapping[str, frozenset[str]] | None = None) -> Bound:
    if not graph.nodes or not devices:
        return Bound(0.0, 0.0, 0.0, "", None, len(devices))
    by_name = {d.name: d for d in devices}
    fixed = {d.name: model.fixed_seconds(d) for d in devices}
    whole = {d.name: fixed[d.name] for d in devices}  # device -> the whole graph there
    work, largest, largest_node = 0.0, 0.0, graph.nodes[0].name
    for node in graph.nodes:
        able = [by_name[n] for n in (allowed or {}).get(node.name, by_name) if n in by_name]
        times = [(model.node_seconds(node.name, d), d) for d in able or devices]
        work += min(t for t, _ in times)
        alone = min(t + fixed[d.name] for t, d in times)
        if alone > largest:
            largest, largest_node = alone, node.name
        runs = {d.name: t for t, d in times}
        for name in list(whole):
            if name in runs:
                whole[name] += runs[name]
            else:
                del whole[name]  # placement keeps this node off it
    need = weight_bytes(graph, graph.nodes) + peak_activation_bytes(graph, graph.nodes)
    single = min((t for name, t in whole.items() if by_name[name].memory_bytes >= need),
                 default=None)
    k = len(devices)
    copy = _cheapest_copy(graph, model, devices) if _linked(graph) else 0.0
    spread = (work + copy) / k + min(fixed.values())
    confined, confined_to = _confined(graph, model, by_name, fixed, allowed or {})
    split = max(spread, largest, confined)
    options = ([split] if k > 1 else []) + ([single] if single is not None else [])
    return Bound(min(options, default=split), spread, largest, largest_node, single, k,
                 confined, confined_to)


def _confined(graph: Graph, model: CostModel, by_name: Mapping[str, DeviceConfig],
              fixed: Mapping[str, float], allowed: Mapping[str, frozenset[str]]
              ) -> tuple[float, tuple[str, ...]]:
    """The most, over each set S of devices placement allows some node, of the work of
    the nodes allowed only within S, at its fastest there, over |S|, plus S's least fixed
    cost; and that S."""
    best: tuple[float, tuple[str, ...]] = (0.0, ())
    # every set short of all the devices: the whole set is the work bound's
    for group, nodes in confined_groups(graph, allowed, by_name):
        devices = [by_name[d] for d in group]
        work = sum(min(model.node_seconds(node.name, d) for d in devices) for node in nodes)
        seconds = work / len(group) + min(fixed[d] for d in group)
        best = max(best, (seconds, tuple(sorted(group))))
    return best


def _linked(graph: Graph) -> bool:
    """Whether every node reaches every other through activations: a tensor made from
    weights alone links no one, since a partition reading it makes it itself."""
    linked = nx.Graph((a, b) for a, b, tensors in graph.dag.edges(data="tensors")
                      if not all(map(graph.is_constant, tensors)))
    linked.add_nodes_from(graph.dag)
    return len(linked) > 0 and nx.is_connected(linked)


def _cheapest_copy(graph: Graph, model: CostModel, devices: Sequence[DeviceConfig]) -> float:
    """The least one activation crossing to another device costs."""
    sizes = [graph.tensor_bytes(t) for t in graph.producer
             if graph.consumers.get(t) and not graph.is_constant(t)]
    if not sizes:
        return 0.0
    return min(model.receive_seconds(min(sizes), d) for d in devices)
