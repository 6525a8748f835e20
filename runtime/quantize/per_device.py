"""Per-device precision: quantize only what the plan puts on devices that run int8.

The float model is planned with the nodes onnxruntime's quantizer handles free to run
in either precision (so an int8-only device may take them, and so may a float-only
one; the rest stay float); those that land on a device whose `precisions` lack int8
stay in float, the others are quantized.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.devices.config import DeviceConfig
from runtime.graph import Graph
from runtime.partition import Plan, partition
from runtime.precision import assume_precisions, node_precisions
from runtime.quantize.quantizer import quantizable_ops


def float_nodes_by_device(graph: Graph, devices: Sequence[DeviceConfig], mode: str = "balanced",
                          fmt: str = "qdq") -> tuple[list[str], Plan]:
    """(nodes to keep in float, the plan that decided it) for a prepared float graph."""
    ops = quantizable_ops(fmt)
    own = node_precisions(graph)
    view = assume_precisions(graph, {n.name: None for n in graph.nodes
                                     if n.op_type in ops and own[n.name] == "float"})
    plan = partition(view, devices, mode)
    runs_int8 = {d.name for d in devices if d.precisions is None or "int8" in d.precisions}
    keep = [n for p in plan.partitions if p.device not in runs_int8 for n in p.nodes
            if n in view.by_name and view.node(n).op_type in ops]
    return keep, plan
