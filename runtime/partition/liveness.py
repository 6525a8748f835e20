"""Live activation bytes while a partition runs its nodes in order."""

from __future__ import annotations

import math
from collections.abc import Container, Sequence

import numpy as np

from runtime.graph import Graph, Node
from runtime.machine import machine_bytes
from runtime.precision import held_bytes
from runtime.request_memory import RequestMemory, compiled_dim, live_bytes


def held_as_weight(graph: Graph, tensor: str, inside: Container[str]) -> bool:
    """Is the tensor a weight of the nodes `inside`: an initializer, or a tensor made
    from weights alone by a node elsewhere, which they make as they load
    (`submodel.weights_of`) and hold as onnxruntime holds an initializer?"""
    return graph.is_weight(tensor) or (graph.is_constant(tensor)
                                       and graph.producer[tensor] not in inside)


def leaves(graph: Graph, tensor: str, inside: Container[str]) -> bool:
    """Does a tensor the nodes `inside` make leave them: a graph output, or an activation
    a node elsewhere reads (not one made from weights alone: that reader makes its own as
    it loads)?"""
    return tensor in graph.output_set or (not graph.is_constant(tensor) and any(
        c not in inside for c in graph.consumers.get(tensor, ())))


def live_intervals(graph: Graph, nodes: Sequence[Node]) -> dict[str, tuple[int, int]]:
    """Tensor -> (first step, last step) it occupies memory, weights excluded.

    Inputs from outside live from step 0 to their last reader; a tensor made here lives
    from its producer to its last reader here, or to the end if it is a graph output or
    anything outside reads it. A tensor made from weights alone that is no graph output
    is not kept for readers elsewhere (each makes its own as it loads), and one nothing
    here reads is not held at all (onnxruntime drops the nodes making it).
    """
    inside = {n.name for n in nodes}
    end = len(nodes) - 1
    spans: dict[str, list[int]] = {}
    for step, node in enumerate(nodes):
        for t in node.reads:
            if not held_as_weight(graph, t, inside):
                span = spans.setdefault(t, [0, step])
                span[1] = max(span[1], step)
        for t in node.writes:
            if leaves(graph, t, inside):
                spans[t] = [step, end]
            elif not graph.is_constant(t) or any(c in inside for c in graph.consumers.get(t, ())):
                spans[t] = [step, step]
    return {t: (s, e) for t, (s, e) in spans.items()}


def peak_activation_bytes(graph: Graph, nodes: Sequence[Node]) -> int:
    spans = live_intervals(graph, nodes)
    return int(live_bytes(list(spans.values()), [held_bytes(graph, t) for t in spans],
                          len(nodes)).max(initial=0))


def weight_names(graph: Graph, nodes: Sequence[Node]) -> list[str]:
    inside = {n.name for n in nodes}
    return list(dict.fromkeys(t for n in nodes for t in n.reads
                              if held_as_weight(graph, t, inside)))


def weight_bytes(graph: Graph, nodes: Sequence[Node]) -> int:
    return sum(graph.tensor_bytes(t) for t in weight_names(graph, nodes))


class StretchMemory:
    """`weight_bytes + peak_activation_bytes` of any stretch [a, b) of one order, from
    arrays indexed once, so asking costs array work over the stretch rather than a Python
    walk of it (the partitioner asks for thousands of stretches of a long order).

    The stretch's liveness as `live_intervals` reads it: a tensor made at p lives to the
    end if the graph outputs it or a node at or after b reads it, else to its last reader
    (p if none reads it); one made from weights alone, to its last reader before b (not
    held if none). An activation made before a, or a graph input, lives from a to its
    last reader before b. Weights count once each, whoever reads them, and so does a
    tensor made from weights alone before a (`held_as_weight`).
    """

    def __init__(self, graph: Graph, nodes: Sequence[Node]):
        position = {node.name: i for i, node in enumerate(nodes)}
        ids: dict[str, int] = {}
        reads: list[tuple[int, int]] = []  # (position, activation) per activation read
        weight_reads: list[tuple[int, int]] = []
        made: list[tuple[int, int]] = []  # (position, tensor) per tensor written
        for i, node in enumerate(nodes):
            for t in node.reads:
                (weight_reads if graph.is_weight(t) else reads).append(
                    (i, ids.setdefault(t, len(ids))))
            made += [(i, ids.setdefault(t, len(ids))) for t in node.writes]
        names = list(ids)
        self.size = np.array([held_bytes(graph, t) for t in names], dtype=np.float64)
        self.producer = np.full(len(names), -1, dtype=np.int64)
        for i, made_id in made:
            self.producer[made_id] = i
        # the last position any node reads it from (the end of the order for a graph
        # output), and the last an activation read extends it to
        self.last_reader = np.array([
            len(nodes) if t in graph.output_set else
            max((position.get(c, len(nodes)) for c in graph.consumers.get(t, ())), default=-1)
            for t in names], dtype=np.int64)
        self.last_read = self.last_reader.copy()
        self.last_read[[ids[t] for t in names if graph.is_weight(t)]] = -1
        # made from weights alone: a weight of a stretch its producer is not in, an
        # activation of one it is in, that no reader after the stretch keeps
        self.loaded = np.array([graph.is_constant(t) and not graph.is_weight(t)
                                for t in names], dtype=bool)
        self.stays = self.loaded & (self.last_reader < len(nodes))
        self.loaded_size = np.array([graph.tensor_bytes(t) for t in names], dtype=np.float64)
        self.read_at, self.read_id = _columns(reads)
        self.weight_at, self.weight_id = _columns(weight_reads)
        self.made_at, self.made_id = _columns(made)
        self._memo: dict[tuple[int, int], tuple[int, int, int]] = {}

    def __call__(self, a: int, b: int) -> int:
        weights, peak, _ = self.split(a, b)
        return weights + peak

    def split(self, a: int, b: int) -> tuple[int, int, int]:
        """(weight bytes, peak live activation bytes, bytes of the activations it reads
        that were made before a or are graph inputs) of [a, b). Memoised: a device's
        earlier stretches are asked again each time a region is offered to it."""
        if (a, b) not in self._memo:
            self._memo[a, b] = self._split(a, b) if a < b else (0, 0, 0)
        return self._memo[a, b]

    def _split(self, a: int, b: int) -> tuple[int, int, int]:
        w0, w1 = np.searchsorted(self.weight_at, (a, b))
        weights = self.size[np.unique(self.weight_id[w0:w1])].sum()
        r0, r1 = np.searchsorted(self.read_at, (a, b))
        read, last = np.unique(self.read_id[r0:r1][::-1], return_index=True)
        last_at = self.read_at[r0:r1][::-1][last]  # each tensor's last read before b
        m0, m1 = np.searchsorted(self.made_at, (a, b))
        made, at = self.made_id[m0:m1], self.made_at[m0:m1]
        end = np.where(self.last_reader[made] >= b, b - 1,
                       np.maximum(at, self.last_read[made]))
        stays = np.flatnonzero(self.stays[made])
        if len(stays):  # to its last read inside, or not held (ending before it starts)
            k = np.searchsorted(read, made[stays])
            found = k < len(read)
            found[found] = read[k[found]] == made[stays][found]
            end[stays] = at[stays] - 1
            end[stays[found]] = last_at[k[found]]
        outside = self.producer[read] < a
        loaded = outside & self.loaded[read]
        weights += self.loaded_size[read[loaded]].sum()
        held = outside & ~loaded
        starts = np.concatenate([at - a, np.zeros(int(held.sum()), dtype=np.int64)])
        ends = np.concatenate([end, last_at[held]]) - a + 1
        sizes = np.concatenate([self.size[made], self.size[read[held]]])
        m = b - a + 1
        live = np.cumsum(np.bincount(starts, sizes, m) - np.bincount(ends, sizes, m))
        return int(weights), int(live.max()), int(self.size[read[held]].sum())


def _columns(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(position, id) pairs, in position order, as two arrays."""
    array = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return array[:, 0].copy(), array[:, 1].copy()


def request_memory(graph: Graph, parts: Sequence[Sequence[str]] = (), limit: int | None = None
                   ) -> RequestMemory | None:
    """What a request's activations need at its sizes, over `parts` (each partition's
    nodes, in its order; default: the graph as one) run as the memory plan counts them;
    `limit`: default the machine's memory. None where no input has a named size, or the
    machine does not say its memory."""
    axes = {d: (name, axis) for name in graph.inputs if name in graph.tensors
            for axis, d in enumerate(graph.tensors[name].dims or ()) if isinstance(d, str)}
    limit = limit or machine_bytes()
    if not axes or limit is None or not graph.nodes:
        return None
    names, dims, shapes, itemsizes, spans, ranges, first = [], [], [], [], [], [], 0
    for part in parts or [[n.name for n in graph.nodes]]:
        for t, (start, stop) in live_intervals(graph, [graph.node(n) for n in part]).items():
            info = graph.tensors.get(t)
            if info is None or info.shape is None or not (held := held_bytes(graph, t)):
                continue
            declared = info.dims if info.dims and len(info.dims) == len(info.shape) \
                else info.shape  # a rank inference did not know: its size at load
            names.append(t)
            dims.append(tuple(compiled_dim(d, b, axes)
                              for d, b in zip(declared, info.shape, strict=True)))
            shapes.append(tuple(info.shape))
            itemsizes.append(held / max(math.prod(info.shape), 1))
            spans.append((first + start, first + stop))
        ranges.append((first, first + len(part)))
        first += len(part)
    bound = {d: shape[axis] for d, (name, axis) in axes.items()
             if (shape := graph.tensors[name].shape) is not None}
    return RequestMemory(axes, bound, tuple(names), tuple(dims), tuple(shapes),
                         np.array(itemsizes), np.array(spans, dtype=np.int64).reshape(-1, 2),
                         tuple(ranges), limit)
