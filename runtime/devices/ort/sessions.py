"""What the installed onnxruntime accepts, and CPU sessions of models it accepts.

    model = loadable(model)              # an IR version and ai.onnx opset it reads
    session = cpu_session(model, threads=2)

The backends (`cpu`, `sim`), the node checks (`kernels`), the sub-model extractor and
the plain-onnxruntime baselines all share these, so they live with the devices and know
nothing of partitions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from runtime.devices.external import serialized
from runtime.devices.ort.options import new_session, session_options
from runtime.errors import ProvisionError, first_line
from runtime.graph import holds_half, subgraphs
from runtime.onnx_kinds import DEFAULT_DOMAINS

OLDEST_IR = 7


def cpu_session(model: onnx.ModelProto | bytes, threads: int = 1,
                external: Mapping[str, np.ndarray] | None = None, stamp: bool = False,
                optimized: bool = True, spin: bool = True) -> ort.InferenceSession:
    """An onnxruntime CPU session of a model (or its serialized bytes; `external`: the
    files it names as external data, in memory; `optimized`, `spin`: as
    `session_options`); any failure becomes a one-line ProvisionError. `stamp`: made
    `loadable` first, on the copy serialized (so a model past 2 GB is not copied whole
    for it)."""
    data, held = (model, {}) if isinstance(model, bytes) else serialized(
        model, stamped if stamp else None)
    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else model
        return new_session(data, threads, {**held, **(external or {})}, holds_half(proto),
                           optimized, spin)
    except Exception as exc:
        raise ProvisionError(f"onnxruntime cannot load {model_name(model)} on CPU: "
                             f"{first_line(exc)}") from None


def model_name(model: onnx.ModelProto | bytes) -> str:
    """The graph's name, for messages; "model" when it has none or cannot be read."""
    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else model
    except Exception:
        return "model"
    return proto.graph.name or "model"


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
    return stamped(out)


def stamped(model: onnx.ModelProto) -> onnx.ModelProto:
    """`loadable` in place, for a model made here (nothing of it copied)."""
    model.ir_version = min(model.ir_version, supported_ir_version())
    _restamp_opset(model)
    return model


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
