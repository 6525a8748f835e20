"""One partition -> a self-contained ONNX model, and CPU sessions for such models.

    model = extract(graph, plan.partitions[0])   # its nodes, inputs, outputs and weights
    session = cpu_session(model, threads=2)

The sub-model keeps declared types (symbolic dims too, so any batch size runs) and is
stamped with an IR version and ai.onnx opset the installed onnxruntime accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import onnx
import onnxruntime as ort
from onnx import helper

from runtime.driver import session_options  # the bundle driver's: both paths alike
from runtime.errors import ProvisionError
from runtime.graph import DEFAULT_DOMAINS, Graph, subgraphs
from runtime.partition.plan import Partition

OLDEST_IR = 7


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()),
                type(exc).__name__)


def cpu_session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime CPU session; any failure becomes a one-line ProvisionError."""
    try:
        return ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ProvisionError(f"onnxruntime cannot load {model.graph.name or 'model'} on CPU: "
                             f"{_first_line(exc)}") from None


def _loads(ir_version: int, opset: int) -> bool:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    try:
        ort.InferenceSession(model.SerializeToString(), session_options(1),
                             providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


@functools.cache
def supported_ir_version() -> int:
    """The newest IR version the installed onnxruntime loads (probed once)."""
    return next((ir for ir in range(onnx.IR_VERSION, OLDEST_IR - 1, -1) if _loads(ir, 11)),
                OLDEST_IR)


@functools.cache
def supported_opset() -> int:
    """The newest ai.onnx opset the installed onnxruntime loads (probed once)."""
    ir = supported_ir_version()
    return next((v for v in range(onnx.defs.onnx_opset_version(), 6, -1) if _loads(ir, v)), 7)


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    for node in nodes:
        yield node
        for sub in subgraphs(node):
            yield from _all_nodes(sub.node)


def _since(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, max_inclusive_version=opset, domain="").since_version
    except onnx.defs.SchemaError:
        return None


def same_ops(ops: Iterable[str], high: int, low: int) -> bool:
    """True if every ai.onnx op means the same at opset `low` as at opset `high`."""
    return all(_since(op, high) is not None and _since(op, high) == _since(op, low) for op in ops)


def loadable(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model stamped with an IR version and ai.onnx opset the installed onnxruntime
    accepts: the IR version capped, the opset lowered when no op used changed in between."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = min(model.ir_version, supported_ir_version())
    _restamp_opset(out)
    return out


def _restamp_opset(model: onnx.ModelProto) -> None:
    low = supported_opset()
    imports = [op for op in model.opset_import if op.domain in DEFAULT_DOMAINS]
    high = max((op.version for op in imports), default=0)
    if high <= low:
        return
    protos = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    ops = {n.op_type for n in _all_nodes(protos) if n.domain in DEFAULT_DOMAINS}
    if not same_ops(ops, high, low):
        return
    for op in (*imports, *(o for f in model.functions for o in f.opset_import
                           if o.domain in DEFAULT_DOMAINS)):
        op.version = min(op.version, low)


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


def extract(graph: Graph, partition: Partition) -> onnx.ModelProto:
    """A self-contained model running `partition`'s nodes, in order, on its inputs."""
    source = graph.model
    nodes = [graph.node(n) for n in partition.nodes]
    weights = dict.fromkeys(partition.weights)
    weights.update(dict.fromkeys(t for n in nodes for t in n.reads if graph.is_weight(t)))
    protos = [source.graph.node[n.index] for n in nodes]
    # A partition whose results nobody reads (dead nodes) still needs an output to load.
    outputs = partition.outputs or tuple(t for n in nodes for t in n.writes)
    sub = helper.make_graph(
        protos, f"{graph.name}/{partition.name}",
        [_value_info(graph, partition, t, required=True) for t in partition.inputs],
        [_value_info(graph, partition, t, required=False) for t in outputs],
        initializer=[graph.initializers[w] for w in weights])
    model = onnx.ModelProto(ir_version=source.ir_version, producer_name="prism", graph=sub,
                            domain=source.domain, model_version=source.model_version)
    model.opset_import.extend(source.opset_import)
    model.functions.extend(source.functions)
    return loadable(model)
