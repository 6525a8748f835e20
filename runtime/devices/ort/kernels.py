"""Can onnxruntime's CPU provider run this node, in this model? Asked before placement.

A node runs on onnxruntime when, after the sub-model is re-stamped to an opset the
installed onnxruntime reads (`sessions.loadable`), a CPU kernel is registered for its
op at the version the model's opset selects and for the types its tensors have (for a
node reading float16, the float kernel will do: onnxruntime casts around it; or the op
is a function onnxruntime inlines), every tensor it exchanges with the rest of the plan
has a dtype onnxruntime's Python API can take, and a session of the node alone loads
(probed once per node kind and types, and kept between processes: `kept_probes`; that
finds attributes onnxruntime's schemas lack and kernels that fail at initialisation).
Model-local functions are checked node by node, as are the bodies of If, Loop and Scan.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from runtime.devices.backends import defines_function
from runtime.devices.ort import kept_probes
from runtime.devices.ort import sessions as accepted  # by module: tests can narrow what it accepts
from runtime.errors import without_source
from runtime.graph import Graph, Node, subgraphs
from runtime.onnx_kinds import DEFAULT_DOMAINS

_CONSTANTS = frozenset({"Constant"})  # folded into initializers at load; no kernel needed


@dataclass(frozen=True)
class Kernel:
    first: int
    last: int
    types: Mapping[str, frozenset[str]]


@functools.cache
def kernel_table() -> dict[tuple[str, str], tuple[Kernel, ...]]:
    """(domain, op) -> the CPU provider's kernels; the default domain is ''."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

    table: dict[tuple[str, str], list[Kernel]] = {}
    for k in get_all_opkernel_def():
        if k.provider != "CPUExecutionProvider":
            continue
        domain = "" if k.domain in DEFAULT_DOMAINS else k.domain
        first, last = k.version_range
        types = {name: frozenset(v) for name, v in k.type_constraints.items()}
        table.setdefault((domain, k.op_name), []).append(Kernel(first, last, types))
    return {key: tuple(v) for key, v in table.items()}


def type_string(kind: onnx.TypeProto) -> str | None:
    """onnxruntime's name of a type: tensor(float), seq(tensor(int64)), optional(...)."""
    which = kind.WhichOneof("value")
    if which == "tensor_type":
        if not kind.tensor_type.elem_type:
            return None
        name = onnx.TensorProto.DataType.Name(kind.tensor_type.elem_type).lower()
        return f"tensor({name})"
    if which == "sequence_type":
        inner = type_string(kind.sequence_type.elem_type)
        return inner and f"seq({inner})"
    if which == "optional_type":
        inner = type_string(kind.optional_type.elem_type)
        return inner and f"optional({inner})"
    return None


def _leaf_elem_types(kind: onnx.TypeProto) -> Iterable[int]:
    which = kind.WhichOneof("value")
    if which == "tensor_type":
        yield kind.tensor_type.elem_type
    elif which == "sequence_type":
        yield from _leaf_elem_types(kind.sequence_type.elem_type)
    elif which == "optional_type":
        yield from _leaf_elem_types(kind.optional_type.elem_type)


@functools.cache
def python_exchangeable(elem_type: int) -> bool:
    """onnxruntime's Python API takes and returns numpy's own dtypes only: not the
    ml_dtypes ones (bfloat16, float8, int4, ...)."""
    if not elem_type:
        return True
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).isbuiltin == 1
    except (KeyError, TypeError, ValueError):
        return False


def _schema(op: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, version, domain)
    except onnx.defs.SchemaError:
        return None


def _formal(params: Sequence[onnx.defs.OpSchema.FormalParameter], i: int
            ) -> onnx.defs.OpSchema.FormalParameter | None:
    if i < len(params):
        return params[i]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _types_fit(kernel: Kernel, schema: onnx.defs.OpSchema, node: onnx.NodeProto,
               texts: Mapping[str, str]) -> bool:
    for params, names in ((schema.inputs, node.input), (schema.outputs, node.output)):
        for i, name in enumerate(names):
            formal = _formal(params, i) if name else None
            allowed = kernel.types.get(formal.type_str) if formal is not None else None
            text = texts.get(name) if allowed is not None else None
            if allowed is not None and text is not None and text not in allowed:
                return False
    return True


def _node_types(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto]) -> dict[str, str]:
    """onnxruntime's names of the types of the node's typed inputs and outputs."""
    texts = {}
    for name in (*node.input, *node.output):
        text = type_string(types[name]) if name in types else None
        if text is not None:
            texts[name] = text
    return texts


_HALF, _FLOAT = "tensor(float16)", "tensor(float)"


def _cast_to_float(node: onnx.NodeProto, texts: Mapping[str, str]) -> dict[str, str] | None:
    """The types onnxruntime runs a node with when no CPU kernel takes its float16 inputs:
    its InsertCastTransformer casts every float16 tensor the node reads to float, runs the
    float kernel and casts float16 outputs back. It does so only for a node that reads a
    float16 tensor (not bfloat16, not a sequence; a node making float16 from other types
    needs a float16 kernel) and holds no subgraph. None when it does not apply."""
    if any(True for _ in subgraphs(node)) or \
            not any(texts.get(name) == _HALF for name in node.input if name):
        return None
    return {name: _FLOAT if text == _HALF else text for name, text in texts.items()}


def _some_fit(kernels: Sequence[Kernel], schema: onnx.defs.OpSchema, node: onnx.NodeProto,
              types: Mapping[str, onnx.TypeProto]) -> bool:
    """Does one of `kernels` take the node's types, as they are or as onnxruntime runs them
    (`_cast_to_float`)?"""
    texts = _node_types(node, types)
    ways = (texts, _cast_to_float(node, texts))
    return any(_types_fit(k, schema, node, way) for way in ways if way is not None
               for k in kernels)


def _type_list(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto]) -> str:
    texts = [type_string(types[n]) for n in node.input if n in types]
    return ", ".join(t for t in texts if t) or "its types"


class _Check:
    """The checks for one model: its opsets and declared types."""

    def __init__(self, graph: Graph):
        self.ir = accepted.supported_ir_version()
        self.low = accepted.supported_opset()
        self.opsets = {("" if d in DEFAULT_DOMAINS else d): v for d, v in graph.opsets.items()}
        self.types = graph.types
        self.weights = graph.initializers

    def node(self, proto: onnx.NodeProto, opsets: Mapping[str, int],
             types: Mapping[str, onnx.TypeProto]) -> str | None:
        domain = "" if proto.domain in DEFAULT_DOMAINS else proto.domain
        op = proto.op_type
        version = opsets.get(domain)
        if version is None:
            return f"the model imports no opset of domain {domain!r}"
        schema = _schema(op, version, domain)
        since = schema.since_version if schema is not None else version
        if domain == "" and version > self.low:
            old = _schema(op, self.low, domain)
            if schema is None or old is None or old.since_version != since:
                return (f"{op} changed at opset {since}, after opset {self.low}, the newest "
                        f"onnxruntime reads, so the model cannot be re-stamped")
        problem = self._kernel(proto, domain, op, since, schema, opsets, types)
        if problem:
            return problem
        for sub in subgraphs(proto):
            inner_types = {**types, **{v.name: v.type for v in (*sub.input, *sub.output,
                                                                *sub.value_info)}}
            for n in sub.node:
                problem = self.node(n, opsets, inner_types)
                if problem:
                    return f"{op} body: {problem}"
        return None

    def _kernel(self, proto: onnx.NodeProto, domain: str, op: str, since: int,
                schema: onnx.defs.OpSchema | None, opsets: Mapping[str, int],
                types: Mapping[str, onnx.TypeProto]) -> str | None:
        if domain == "" and op in _CONSTANTS:
            return None
        kernels = [k for k in kernel_table().get((domain, op), ()) if k.first <= since <= k.last]
        if kernels:
            typed = self._with_weights(proto, types)
            if schema is None or _some_fit(kernels, schema, proto, typed):
                return None
            return f"onnxruntime has no CPU kernel for {op}({since}) on {_type_list(proto, typed)}"
        if domain == "" and schema is not None and defines_function(schema):
            return None  # inlined by onnxruntime; the probe tells whether that works
        return f"onnxruntime has no CPU kernel for {op}({since})"

    def _with_weights(self, proto: onnx.NodeProto, types: Mapping[str, onnx.TypeProto]
                      ) -> Mapping[str, onnx.TypeProto]:
        """`types` and those of the weights `proto` reads, which inference leaves untyped:
        a float16 Where between two float16 constants runs as onnxruntime casts it to
        float, which only their type tells."""
        weights = {name: helper.make_tensor_type_proto(t.data_type, list(t.dims))
                   for name in proto.input if name not in types
                   and (t := self.weights.get(name)) is not None}
        if not weights:
            return types
        return {**{n: types[n] for n in (*proto.input, *proto.output) if n in types}, **weights}

    def probe(self, proto: onnx.NodeProto, opsets: Mapping[str, int],
              types: Mapping[str, onnx.TypeProto]) -> str | None:
        """Does a session of this one node load? That finds what the kernel table cannot
        tell: attributes onnxruntime's schemas lack, kernels failing at initialisation,
        function ops it cannot inline. Nodes with untyped inputs are not probed. An input
        of no elements is a constant of the probe, its value known: from opset 13, shape
        inference refuses a Resize given both scales and sizes unless it sees the scales
        are empty (as exporters write them at opset 11, and quantizing raises to 13)."""
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        node.name = "probe"
        # canonical tensor names, so nodes alike but for their names share one probe
        rename: dict[str, str] = {}
        ins: list[onnx.ValueInfoProto] = []
        outs: list[onnx.ValueInfoProto] = []
        empty: list[int] = []
        for i, name in enumerate(proto.input):
            if name and name not in rename:
                if name not in types or type_string(types[name]) is None:
                    return None
                rename[name] = f"i{i}"
                if 0 in (_static_shape(types, name) or ()):
                    empty.append(len(ins))
                ins.append(helper.make_value_info(rename[name], types[name]))
        for i, name in enumerate(proto.output):
            if name and name not in rename:
                rename[name] = f"o{i}"
                outs.append(helper.make_value_info(rename[name], types[name]) if name in types
                            else helper.make_empty_tensor_value_info(rename[name]))
        node.input[:] = [rename.get(n, n) for n in proto.input]
        node.output[:] = [rename.get(n, n) for n in proto.output]
        stamped = {d: (min(v, self.low) if d == "" else v) for d, v in opsets.items()}
        return _load_error(node.SerializeToString(),
                           tuple(i.SerializeToString() for i in ins),
                           tuple(o.SerializeToString() for o in outs),
                           tuple(sorted(stamped.items())), self.ir, tuple(empty))


@functools.lru_cache(maxsize=8192)
def _load_error(node: bytes, ins: tuple[bytes, ...], outs: tuple[bytes, ...],
                opsets: tuple[tuple[str, int], ...], ir: int, empty: tuple[int, ...] = ()
                ) -> str | None:
    """Why a session of `node` alone fails to load, or None: as a process probed it before
    (`kept_probes`), else probed now and kept. `empty`: the inputs (by position in `ins`)
    given as constants of no elements."""
    probe = kept_probes.key(node, *ins, *outs, repr(
        (len(ins), opsets, ir, *((empty,) if empty else ()))).encode())
    if (found := kept_probes.found(probe)) is not None:
        return found[0]
    error = _probed(node, ins, outs, opsets, ir, empty)
    kept_probes.keep(probe, error)
    return error


def _probed(node: bytes, ins: tuple[bytes, ...], outs: tuple[bytes, ...],
            opsets: tuple[tuple[str, int], ...], ir: int, empty: tuple[int, ...] = ()
            ) -> str | None:
    import onnxruntime as ort

    proto = onnx.NodeProto.FromString(node)
    inputs = [onnx.ValueInfoProto.FromString(b) for b in ins]
    constants = [helper.make_tensor(inputs[i].name, inputs[i].type.tensor_type.elem_type,
                                    [d.dim_value for d in inputs[i].type.tensor_type.shape.dim],
                                    []) for i in empty]
    graph = helper.make_graph([proto], "probe", [v for i, v in enumerate(inputs) if i not in empty],
                              [onnx.ValueInfoProto.FromString(b) for b in outs], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in opsets])
    model.ir_version = ir
    try:
        ort.InferenceSession(model.SerializeToString(), accepted.session_options(1),
                             providers=["CPUExecutionProvider"])
    except Exception as exc:
        text = without_source(str(exc).replace("[ONNXRuntimeError] :", "").strip())
        return " ".join(text.split())[:200] or type(exc).__name__
    return None


def _static_shape(types: Mapping[str, onnx.TypeProto], name: str) -> tuple[int | None, ...] | None:
    kind = types.get(name) if name else None
    if kind is None or not kind.HasField("tensor_type") or \
            not kind.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None
                 for d in kind.tensor_type.shape.dim)


def _elem(types: Mapping[str, onnx.TypeProto], name: str) -> int:
    kind = types.get(name) if name else None
    return kind.tensor_type.elem_type if kind is not None and kind.HasField("tensor_type") else 0


def _per_channel_zero_point(node: onnx.NodeProto, types) -> str | None:
    shape = _static_shape(types, node.input[3]) if len(node.input) > 3 else None
    known = [d for d in shape or () if d is not None]
    if shape and len(known) == len(shape) and int(np.prod(known)) > 1:
        return "onnxruntime's ConvInteger takes a per-tensor weight zero point only"
    return None


def _empty_bool_reduce(node: onnx.NodeProto, types) -> str | None:
    shape = _static_shape(types, node.input[0])
    if _elem(types, node.input[0]) == onnx.TensorProto.BOOL and shape and 0 in shape:
        return f"onnxruntime's {node.op_type} refuses an empty bool tensor"
    return None


def _attention_mask_span(node: onnx.NodeProto, types) -> str | None:
    key = _static_shape(types, node.input[1]) if len(node.input) > 1 else None
    mask = _static_shape(types, node.input[3]) if len(node.input) > 3 else None
    past = len(node.input) > 4 and any(node.input[4:6])
    if key and mask and not past and len(key) == 4 and None not in (key[2], mask[-1]) \
            and mask[-1] != key[2]:
        return "onnxruntime's Attention needs the mask to span the whole key sequence"
    return None


# Limits of onnxruntime CPU kernels that load but refuse at run time, decided from
# declared types and shapes (found by `prism conformance`).
KERNEL_LIMITS = {
    ("", "ConvInteger"): _per_channel_zero_point,
    ("", "ReduceMax"): _empty_bool_reduce,
    ("", "ReduceMin"): _empty_bool_reduce,
    ("", "Attention"): _attention_mask_span,
}


def ort_problem(node: Node, graph: Graph) -> str | None:
    """Why onnxruntime's CPU provider cannot run `node` of `graph` in a partition, or None."""
    memo = graph.memo.setdefault("onnxruntime cpu", {})
    if node.name not in memo:
        memo[node.name] = _problem(node, graph)
    return memo[node.name]


def _problem(node: Node, graph: Graph) -> str | None:
    for t in node.reads + node.writes:
        kind = graph.types.get(t)
        if kind is None:
            continue
        for elem in _leaf_elem_types(kind):
            if not python_exchangeable(elem):
                name = onnx.TensorProto.DataType.Name(elem).lower()
                return f"onnxruntime's Python API cannot exchange {name} tensors ({t})"
    check = _Check(graph)
    proto = graph.model.graph.node[node.index]
    problem = check.node(proto, check.opsets, graph.types)
    limit = KERNEL_LIMITS.get(("" if node.domain in DEFAULT_DOMAINS else node.domain,
                               node.op_type))
    if problem is None and limit is not None:
        problem = limit(proto, graph.types)
    if problem or node.outer_inputs or any(True for _ in subgraphs(proto)):
        return problem
    error = check.probe(proto, check.opsets, graph.types)
    return error and f"onnxruntime cannot load {node.op_type}: {error}"
