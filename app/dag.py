"""The partition DAG laid out for drawing, shared by both dashboards."""

from __future__ import annotations

import json
from dataclasses import dataclass

import networkx as nx

from runtime.graph import Graph
from runtime.partition import Plan
from runtime.partition.plan import PALETTE
from runtime.partition.steps import Replay

UNASSIGNED = "#dddddd"


@dataclass(frozen=True)
class PartitionEdge:
    src: str
    dst: str
    bytes: int
    tensors: int


def partition_edges(plan: Plan, graph: Graph) -> list[PartitionEdge]:
    """Edges between partitions with the bytes each request sends along them."""
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    sizes: dict[tuple[str, str], dict[str, int]] = {}
    for src, dst, data in graph.dag.edges(data=True):
        if home[src] != home[dst]:
            for t in data["tensors"]:
                sizes.setdefault((home[src], home[dst]), {})[t] = graph.tensor_bytes(t)
    return [PartitionEdge(a, b, sum(ts.values()), len(ts)) for (a, b), ts in sizes.items()]


def partition_levels(plan: Plan, graph: Graph) -> list[list[str]]:
    """Partitions grouped by topological level: level k holds those k hops from a source."""
    dag = nx.DiGraph()
    dag.add_nodes_from(p.name for p in plan.partitions)
    dag.add_edges_from((e.src, e.dst) for e in partition_edges(plan, graph))
    level: dict[str, int] = {}
    for name in nx.topological_sort(dag):
        level[name] = max((level[p] + 1 for p in dag.predecessors(name)), default=0)
    rows: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for p in plan.partitions:
        rows[level[p.name]].append(p.name)
    return rows


def step_dot(graph: Graph, state: Replay, devices: list[str], focus: set[str] | None = None
             ) -> str:
    """Node-level Graphviz of the graph (or the `focus` nodes and their neighbours), each
    node coloured by the device of the partition it has been given so far."""
    colors = {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(devices)}
    shown = set(graph.by_name) if focus is None else {
        m for n in focus for m in (n, *graph.dag.predecessors(n), *graph.dag.successors(n))}
    q = json.dumps
    lines = ["digraph steps {", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for node in graph.nodes:
        if node.name in shown:
            part = state.assignment.get(node.name)
            color = colors.get(state.devices.get(part), UNASSIGNED) if part is not None \
                else UNASSIGNED
            label = f"{node.name}\\n{node.op_type}" + (f" [p{part}]" if part is not None else "")
            lines.append(f'  {q(node.name)} [label="{label}", fillcolor={q(color)}];')
    for src, dst in graph.dag.edges():
        if src in shown and dst in shown:
            lines.append(f"  {q(src)} -> {q(dst)};")
    lines.append("}")
    return "\n".join(lines)
