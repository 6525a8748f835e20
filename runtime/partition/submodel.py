"""One partition -> a self-contained ONNX model.

    model = extract(graph, plan.partitions[0])   # its nodes, inputs, outputs and weights
    model, held = held_extract(graph, part)      # its weights held beside it (Held)

The sub-model keeps declared types (symbolic dims too, so any batch size runs) and is
stamped with an IR version and ai.onnx opset the installed onnxruntime accepts
(`runtime.devices.ort.sessions.stamped`).
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import onnx
from onnx import numpy_helper

from runtime.devices.external import Held
from runtime.devices.ort.sessions import cpu_session, stamped
from runtime.errors import ProvisionError
from runtime.graph import Graph
from runtime.partition.plan import Partition


def _value_info(graph: Graph, partition: Partition, tensor: str, *, required: bool
                ) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=tensor)
    kind = graph.types.get(tensor)
    if kind is not None:
        info.type.CopyFrom(kind)
    elif required:
        raise ProvisionError(f"partition {partition.name} of {graph.name}: input {tensor!r} "
                             f"has no known type")
    return info


def weights_of(graph: Graph, partition: Partition) -> list[onnx.TensorProto]:
    """The initializers `partition`'s model holds: its own, those its nodes read, and
    what it reads that another partition makes from weights alone, made now."""
    weights = dict.fromkeys(partition.weights)
    weights.update(dict.fromkeys(t for n in partition.nodes for t in graph.node(n).reads
                                 if graph.is_weight(t)))
    made = [w for w in weights if not graph.is_weight(w)]
    values = _made_from_weights(graph, partition, made) if made else {}
    return [graph.initializers[w] if graph.is_weight(w) else values[w] for w in weights]


def _made_from_weights(graph: Graph, partition: Partition, tensors: list[str]
                       ) -> dict[str, onnx.TensorProto]:
    """`tensors`, made from weights alone by nodes of other partitions, computed on the
    host by onnxruntime: its device may not run those nodes (a fallback plan), and a
    copy on every request would send the same bytes each time."""
    makers = {graph.producer[t] for t in tensors}
    needed = makers.union(*(nx.ancestors(graph.dag, n) for n in makers))
    maker = replace(partition, name=f"{partition.name}-weights", inputs=(), weights=(),
                    nodes=tuple(n.name for n in graph.nodes if n.name in needed),
                    outputs=tuple(tensors))
    try:
        values = cpu_session(extract(graph, maker)).run(tensors, {})
    except Exception as exc:
        raise ProvisionError(f"partition {partition.name} of {graph.name}: cannot make "
                             f"{tensors[0]} from its weights: {str(exc).splitlines()[0]}"
                             ) from None
    return {t: numpy_helper.from_array(v, t) for t, v in zip(tensors, values, strict=True)}


def extract(graph: Graph, partition: Partition, held: Held | None = None,
            weights: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """A self-contained model running `partition`'s nodes, in order, on its inputs;
    `held`: its weights held beside it as it is made, none of them copied into it;
    `weights`: its `weights_of`, when the caller has them already."""
    source = graph.model
    nodes = [graph.node(n) for n in partition.nodes]
    protos = [source.graph.node[n.index] for n in nodes]
    # A partition whose results nobody reads (dead nodes) still needs an output to load.
    outputs = partition.outputs or tuple(t for n in nodes for t in n.writes)
    model = onnx.ModelProto(ir_version=source.ir_version, producer_name="prism",
                            domain=source.domain, model_version=source.model_version)
    sub = model.graph  # filled in place: each weight is copied once (into it)
    sub.name = f"{graph.name}/{partition.name}"
    sub.node.extend(protos)
    sub.input.extend(_value_info(graph, partition, t, required=True) for t in partition.inputs)
    sub.output.extend(_value_info(graph, partition, t, required=False) for t in outputs)
    weights = weights_of(graph, partition) if weights is None else weights
    sub.initializer.extend(weights if held is None else map(held.take, weights))
    model.opset_import.extend(source.opset_import)
    return stamped(model)


def held_extract(graph: Graph, partition: Partition) -> tuple[onnx.ModelProto, Held | None]:
    """`extract` with its weights held beside it (None when it has none to hold): what
    onnxruntime is handed, each weight's bytes never copied into the model."""
    weights = weights_of(graph, partition)  # made once, where a partition makes some
    held = Held.over(weights)
    return extract(graph, partition, held, weights), held
