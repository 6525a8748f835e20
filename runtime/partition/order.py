"""Topological orders to split along, and the bytes each order cuts."""

from __future__ import annotations

import numpy as np

from runtime.graph import Graph


def model_order(graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes]


def depth_first_order(graph: Graph) -> list[str]:
    """Kahn's algorithm popping the newest ready node: finishes a branch before the next."""
    indegree = {n: graph.dag.in_degree(n) for n in graph.dag}
    index = {n.name: n.index for n in graph.nodes}
    stack = sorted((n for n, d in indegree.items() if d == 0), key=index.__getitem__,
                   reverse=True)
    order = []
    while stack:
        node = stack.pop()
        order.append(node)
        ready = []
        for succ in graph.dag.successors(node):
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
        stack.extend(sorted(ready, key=index.__getitem__, reverse=True))
    return order


def constants_where_read(graph: Graph, order: list[str]) -> list[str]:
    """`order` with each node computed from weights alone (a constant the fold's bound kept
    as work, a quantized weight's DequantizeLinear) moved to just before its first reader:
    it then lands in its reader's partition, not the first, where every later partition
    reading it would have to make it again as it loads. Moving one shortens its output's
    life and nothing else."""
    position = {name: i for i, name in enumerate(order)}
    constant = graph.constant_nodes
    if not constant:
        return order
    moved: list[str] = []
    placed: set[str] = set()
    for name in [*(n for n in order if n not in constant), *order]:  # unread ones last
        stack = [name]
        while stack:  # post-order: a node's constant producers first, in model order
            top = stack[-1]
            waiting = sorted((p for p in graph.dag.predecessors(top)
                              if p in constant and p not in placed), key=position.__getitem__)
            if waiting:
                stack.extend(reversed(waiting))
                continue
            stack.pop()
            if top not in placed:
                placed.add(top)
                moved.append(top)
    return moved


def cut_bytes(graph: Graph, order: list[str]) -> np.ndarray:
    """cut[i] = bytes of activations made before position i and read at or after it (not
    a tensor made from weights alone: no cut carries it)."""
    position = {name: i for i, name in enumerate(order)}
    diff = np.zeros(len(order) + 1, dtype=np.float64)
    for t, producer in graph.producer.items():
        readers = [position[c] for c in graph.consumers.get(t, ())]
        if readers and not graph.is_constant(t):
            start, stop = position[producer] + 1, max(readers)
            if stop >= start:
                diff[start] += graph.tensor_bytes(t)
                diff[stop + 1] -= graph.tensor_bytes(t)
    return np.cumsum(diff)[: len(order)]


def choose_order(graph: Graph) -> tuple[list[str], str]:
    """The candidate order whose cuts carry the fewest bytes on average, and why."""
    candidates = {"model order": constants_where_read(graph, model_order(graph)),
                  "depth-first order": constants_where_read(graph, depth_first_order(graph))}
    means = {k: float(cut_bytes(graph, v).mean()) if v else 0.0 for k, v in candidates.items()}
    best = min(means, key=lambda k: (means[k], k != "model order"))
    detail = ", ".join(f"{k} {v / 1e3:.1f} KB" for k, v in means.items())
    return candidates[best], f"split along the {best}: mean bytes across a cut {detail}"
