"""A plan is checked before use: every node once, partitions acyclic, memory respected."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.plan import Plan
from runtime.units import human_bytes


def validate_plan(plan: Plan, graph: Graph,
                  allowed: Mapping[str, frozenset[str]] | None = None) -> None:
    """Raise PartitionError unless the plan is sound and honours placement (`allowed`)."""
    counts = Counter(n for p in plan.partitions for n in p.nodes)
    missing = [n.name for n in graph.nodes if not counts[n.name]]
    twice = [n for n, c in counts.items() if c > 1]
    strangers = [n for n in counts if n not in graph.by_name]
    for problem, names in (("is in no partition", missing), ("is in several partitions", twice),
                           ("is not in the graph", strangers)):
        if names:
            raise PartitionError(f"invalid plan: node {names[0]} {problem} "
                                 f"({len(names)} such nodes)")
    made_in = {t: i for i, p in enumerate(plan.partitions) for n in p.nodes
               for t in graph.node(n).writes}
    for i, p in enumerate(plan.partitions):
        late = [t for t in p.inputs if made_in.get(t, -1) >= i]
        if late:
            raise PartitionError(f"invalid plan: partition {p.name} reads {late[0]} from a "
                                 f"partition that is not before it (partition DAG has a cycle)")
        for n in p.nodes:
            if allowed is not None and p.device not in allowed[n]:
                raise PartitionError(f"invalid plan: {p.device} cannot run {n} "
                                     f"({graph.node(n).op_type}) by placement; allowed: "
                                     f"{', '.join(sorted(allowed[n]))}")
    capacity = {d.name: d.memory_bytes for d in plan.devices}
    for name, used in plan.device_memory().items():
        cap = capacity[name]
        if used > cap:
            raise PartitionError(f"invalid plan: device {name} needs {human_bytes(used)}, "
                                 f"has {human_bytes(cap)}")
