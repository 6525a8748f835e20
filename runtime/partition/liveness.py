"""Live activation bytes while a partition runs its nodes in order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.graph import Graph, Node


def live_intervals(graph: Graph, nodes: Sequence[Node]) -> dict[str, tuple[int, int]]:
    """Tensor -> (first step, last step) it occupies memory, weights excluded.

    Inputs from outside live from step 0 to their last reader; a tensor made here lives
    from its producer to its last reader here, or to the end if anything outside reads
    it or it is a graph output.
    """
    inside = {n.name for n in nodes}
    end = len(nodes) - 1
    spans: dict[str, list[int]] = {}
    for step, node in enumerate(nodes):
        for t in node.reads:
            if not graph.is_weight(t):
                span = spans.setdefault(t, [0, step])
                span[1] = max(span[1], step)
        for t in node.writes:
            leaves = t in graph.output_set or any(
                c not in inside for c in graph.consumers.get(t, ()))
            spans[t] = [step, end if leaves else step]
    return {t: (s, e) for t, (s, e) in spans.items()}


def peak_activation_bytes(graph: Graph, nodes: Sequence[Node]) -> int:
    if not nodes:
        return 0
    diff = np.zeros(len(nodes) + 1, dtype=np.int64)
    for t, (start, stop) in live_intervals(graph, nodes).items():
        size = graph.tensor_bytes(t)
        diff[start] += size
        diff[stop + 1] -= size
    return int(np.cumsum(diff).max())


def weight_names(graph: Graph, nodes: Sequence[Node]) -> list[str]:
    return list(dict.fromkeys(t for n in nodes for t in n.reads if graph.is_weight(t)))


def weight_bytes(graph: Graph, nodes: Sequence[Node]) -> int:
    return sum(graph.tensor_bytes(t) for t in weight_names(graph, nodes))
