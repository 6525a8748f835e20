"""Boundaries pass what they must: quantize/dequantize nodes stay with their ops, and
a node computed from weights alone with the partition that reads it.

A cut between a DequantizeLinear and the op it feeds, or between an op and the
QuantizeLinear after it, copies a float tensor (four times the bytes of the int8 one
beside it) and stops onnxruntime fusing the op into an integer kernel. After a mode has
split the graph, each such dequantize node moves to its consumers' partition and each
such quantize node to its producer's, so the cut falls between the pair (each reader has
a dequantize node of its own, `runtime.dequantize`). A move is a step; a pair left split
(a user map naming both, a dequantize node read from subgraphs too, a move the devices
cannot take) is a `split` step and a note in the plan's reasons.

Likewise a node the fold kept whose inputs are all weights (a `ConstantOfShape` making a
weight too large to store folded) moves to the one partition reading what it makes: left
behind, it would run there for no one, and the reader would make the weight again as it
loads (`submodel.weights_of`). Where it cannot follow (a fallback device makes it), a
partition left with such nodes alone joins a partition on its device that does work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runtime.cost import CostModel
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.build import build_plan
from runtime.partition.plan import Plan
from runtime.partition.record import Recorder, Steps
from runtime.partition.validate import validate_plan
from runtime.precision import DEQUANTIZE_OPS, split_pairs
from runtime.units import human_bytes


def _index(name: str) -> int | None:
    """A mode's partitions are named p0, p1, ... after their step index."""
    return int(name[1:]) if name[:1] == "p" and name[1:].isdigit() else None


def _moves(graph: Graph, home: Mapping[str, str], device: Mapping[str, str],
           allowed: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """Quantize/dequantize node -> the partition it should join (one placement allows)."""
    moves = {}
    for a, b in split_pairs(graph, home):
        if graph.node(a).op_type in DEQUANTIZE_OPS:
            readers = {home[c] for t in graph.node(a).writes for c in graph.consumers[t]}
            node, part = a, home[b] if len(readers) == 1 else None
        else:
            node, part = b, home[a]
        if part is not None and device[part] in allowed[node]:
            moves[node] = part
    return moves


def _constant_moves(graph: Graph, home: Mapping[str, str], device: Mapping[str, str],
                    allowed: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """Node computed from weights alone -> the other partition reading all it makes (after
    the nodes it feeds have moved: a chain of them moves whole)."""
    moves: dict[str, str] = {}
    for node in reversed(graph.nodes):
        if node.name not in graph.constant_nodes or graph.output_set.intersection(node.writes):
            continue
        readers = {moves.get(c, home[c]) for t in node.writes for c in graph.consumers.get(t, ())}
        part = readers.pop() if len(readers) == 1 else home[node.name]
        if part != home[node.name] and device[part] in allowed[node.name]:
            moves[node.name] = part
    return moves


def _idle_constants(graph: Graph, plan: Plan) -> dict[str, str]:
    """Node -> partition: a partition of nodes computed from weights alone that sends no
    one anything (no outputs: each reader makes what they make as it loads) joins the
    first busy partition on its device, so no request runs it for nothing."""
    idle = {p.name for p in plan.partitions
            if not p.outputs and all(n in graph.constant_nodes for n in p.nodes)}
    moves: dict[str, str] = {}
    for part in (p for p in plan.partitions if p.name in idle):  # in plan order
        busy = next((q.name for q in plan.partitions
                     if q.name not in idle and q.device == part.device), None)
        if busy is not None:
            moves.update(dict.fromkeys(part.nodes, busy))
    return moves


def _rebuilt(graph: Graph, model: CostModel, devices: Sequence[DeviceConfig], plan: Plan,
             home: Mapping[str, str], allowed: Mapping[str, frozenset[str]]) -> Plan:
    """`plan` with its nodes where `home` puts them, checked (PartitionError if not)."""
    position = {n: i for i, n in enumerate(plan.order or (n.name for n in graph.nodes))}
    groups = [(p.name, p.device, sorted((n for n, h in home.items() if h == p.name),
                                        key=position.__getitem__)) for p in plan.partitions]
    rebuilt = build_plan(graph, model, devices, [g for g in groups if g[2]], mode=plan.mode,
                         order=plan.order)
    validate_plan(rebuilt, graph, allowed)
    return rebuilt


def keep_pairs(graph: Graph, model: CostModel, devices: Sequence[DeviceConfig],
               plan: Plan, allowed: Mapping[str, frozenset[str]], rec: Recorder, *,
               move: bool = True) -> Steps[tuple[Plan, dict[str, str]]]:
    """Move quantize/dequantize nodes across boundaries to their ops (if `move`); return
    the plan and a note per node of each pair still split."""
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    device = {p.name: p.device for p in plan.partitions}
    pairs = _moves(graph, home, device, allowed) if move else {}
    constants = _constant_moves(graph, {**home, **pairs}, device, allowed) if move else {}
    moves = {**pairs, **constants}
    if moves:
        new_home = {**home, **moves}
        try:
            moved = _rebuilt(graph, model, devices, plan, new_home, allowed)
        except PartitionError as exc:
            yield rec.step("split", f"kept quantize/dequantize nodes and nodes computed from "
                           f"weights where the split put them: moving them to the ops they "
                           f"feed fails ({exc})")
        else:
            for node, part in moves.items():
                op = graph.node(node).op_type
                why = "computed from weights alone, it is made where it is read" \
                    if node in constants and node not in pairs else \
                    "no float copy between them"
                side = "op it quantizes" if op not in DEQUANTIZE_OPS and node in pairs \
                    else "ops it feeds"
                yield rec.step("move", f"moved {node} ({op}) from {home[node]} to {part} with "
                               f"the {side}: {why}", _index(part), device[part], (node,))
            plan, home = moved, new_home
    if move and (idle := _idle_constants(graph, plan)):
        try:
            merged = _rebuilt(graph, model, devices, plan, {**home, **idle}, allowed)
        except PartitionError:
            pass  # the plan holds as it is; those nodes only run for no one
        else:
            for src in dict.fromkeys(home[n] for n in idle):
                nodes = tuple(n for n in idle if home[n] == src)
                dst = idle[nodes[0]]
                yield rec.step("move", f"moved {src}'s {len(nodes)} nodes, computed from "
                               f"weights alone, to {dst}: every partition reading them makes "
                               f"what they make as it loads, so {src} would run for no one",
                               _index(dst), device[dst], nodes)
            plan, home = merged, {**home, **idle}
    notes = {}
    for a, b in split_pairs(graph, home):
        t = next(t for t in graph.node(a).writes if b in graph.consumers.get(t, ()))
        note = (f"boundary {home[a]} -> {home[b]} splits {a} ({graph.node(a).op_type}) from "
                f"{b} ({graph.node(b).op_type}): {t} crosses as float "
                f"({human_bytes(graph.tensor_bytes(t))}) and the pair cannot be fused")
        yield rec.step("split", note, nodes=(a, b))
        notes[a] = notes[b] = note
    return plan, notes
