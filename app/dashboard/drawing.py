"""A plan laid out for drawing: partitions by topological level, the edges between them
with the bytes each request sends, each device's colour, and the Graphviz text."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from app.dashboard.colors import NO_COLOR, inks
from runtime.partition import Partition, Plan
from runtime.partition.dot import Outline, PartitionEdge, partition_dot, partition_edges, plan_dot


@dataclass(frozen=True)
class PlanDrawing:
    plan: Plan
    outline: Outline
    colors: dict[str, str]  # device -> colour
    edges: tuple[PartitionEdge, ...]
    levels: tuple[tuple[str, ...], ...]  # level k: the partitions k hops from a source

    @classmethod
    def of(cls, plan: Plan, outline: Outline, colors: dict[str, str]) -> PlanDrawing:
        edges = partition_edges(plan, outline)
        dag = nx.DiGraph()
        dag.add_nodes_from(p.name for p in plan.partitions)
        dag.add_edges_from((e.src, e.dst) for e in edges)
        level: dict[str, int] = {}
        for name in nx.topological_sort(dag):
            level[name] = max((level[p] + 1 for p in dag.predecessors(name)), default=0)
        rows: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
        for p in plan.partitions:
            rows[level[p.name]].append(p.name)
        return cls(plan, outline, colors, tuple(edges), tuple(tuple(r) for r in rows))

    @cached_property
    def partitions(self) -> dict[str, Partition]:
        return {p.name: p for p in self.plan.partitions}

    @property
    def order(self) -> list[str]:
        """Partitions level by level, as a selection walks them."""
        return [name for row in self.levels for name in row]

    def color(self, partition: str) -> str:
        return self.colors.get(self.partitions[partition].device, NO_COLOR)

    @cached_property
    def node_dot(self) -> str:
        """Graphviz: every node, a cluster per partition, a copy node per transfer."""
        return plan_dot(self.plan, inks(self.colors), self.outline)

    @cached_property
    def partition_dot(self) -> str:
        """Graphviz: a box per partition, an edge per pair that sends bytes."""
        return partition_dot(self.plan, inks(self.colors), self.edges)
