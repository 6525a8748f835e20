"""ONNX model -> graph IR: named nodes, tensors with bound shapes, weights and a DAG.

Shapes here are for costing only: symbolic dimensions are bound to concrete values
(1 unless the caller says otherwise). `Tensor.dims` keeps the declared dimensions,
symbolic names included, so compiled partitions stay dynamic.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import networkx as nx
import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import external_data_helper, helper, inliner, numpy_helper, shape_inference
from onnx.serialization import registry

from runtime.contrib_types import contrib_value_infos
from runtime.dequantize import one_reader_each
from runtime.errors import DeviceMemoryError, ModelLoadError
from runtime.fold import RANDOM_OPS, FoldReport, fold_constants
from runtime.free_dims import free_sizes, image_sides, made_up_shape
from runtime.large import checked, inferable, shell, too_large, typed_only
from runtime.least_sizes import least_sizes, shaped_inputs
from runtime.machine import machine_bytes, memory_text
from runtime.names import fresh_name
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.run_sizes import kept_sizes
from runtime.stored import disowned, external_shells, kept_open, parsed, stored_at
from runtime.symbolic_sizes import sharpened
from runtime.units import human_bytes

Dim = int | str | None
READ_ANYWAY = 64 << 20  # model bytes read whatever the memory free: a fraction of a second


@dataclass(frozen=True)
class Tensor:
    """A value in the graph. `shape` is bound (ints) for costing; `dims` as declared."""

    name: str
    dtype: str | None
    shape: tuple[int, ...] | None
    dims: tuple[Dim, ...] | None
    elem_type: int = 0
    nbytes: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        size = 0 if self.dtype is None or self.shape is None else (
            math.prod(self.shape) * np.dtype(self.dtype).itemsize)
        object.__setattr__(self, "nbytes", int(size))


@dataclass(frozen=True)
class Node:
    """One node; a node with subgraphs (If, Loop, Scan) is one unit."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, Any]
    outer_inputs: tuple[str, ...] = ()
    index: int = 0
    body_ops: tuple[tuple[str, str], ...] = ()  # (domain, op) its subgraphs run, nested too
    reads: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        """`reads`: every tensor the node reads, explicit inputs then outer-scope ones."""
        object.__setattr__(self, "reads", tuple(dict.fromkeys(
            t for t in (*self.inputs, *self.outer_inputs) if t)))

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(t for t in self.outputs if t)


@dataclass
class Graph:
    """The loaded network. `model` is the checked model with every node named;
    `types` holds each tensor's declared ONNX type (symbolic dims kept)."""

    model: onnx.ModelProto
    nodes: list[Node]
    tensors: dict[str, Tensor]
    initializers: dict[str, onnx.TensorProto]
    inputs: list[str]
    outputs: list[str]
    opsets: dict[str, int]
    bindings: dict[str, int]
    name: str = "network"
    types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)
    dag: nx.DiGraph = field(default_factory=nx.DiGraph)
    # analyses that hold as long as the graph does (e.g. which backend runs which node)
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    folded: FoldReport = field(default_factory=FoldReport)  # what folding did at load
    # the files its weights stay in, open: readable as read though removed or replaced
    opened: tuple[BinaryIO, ...] = field(default=(), repr=False, compare=False)
    # input -> axis -> the least size the graph reads it at (`least_sizes`, at load)
    least: dict[str, dict[int, int]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.by_name = {n.name: n for n in self.nodes}
        self.output_set = frozenset(self.outputs)
        for node in self.nodes:
            for t in node.writes:
                self.producer[t] = node.name
            for t in node.reads:
                self.consumers.setdefault(t, []).append(node.name)
        self.dag.add_nodes_from(n.name for n in self.nodes)
        for node in self.nodes:
            for t in node.reads:
                src = self.producer.get(t)
                if src is not None:
                    edge = self.dag.get_edge_data(src, node.name)
                    if edge is None:
                        self.dag.add_edge(src, node.name, tensors=[t])
                    elif t not in edge["tensors"]:
                        edge["tensors"].append(t)

    def node(self, name: str) -> Node:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in {self.name}") from None

    def is_weight(self, tensor: str) -> bool:
        return tensor in self.initializers

    @property
    def constant_nodes(self) -> frozenset[str]:
        """Nodes computed from weights alone (a constant the fold's bound kept as work, a
        quantized weight's DequantizeLinear): what they make is the same every request."""
        found = self.memo.get("constant_nodes")
        if found is None:
            made: set[str] = set()
            for node in self.nodes:  # topological: a node's producers come first
                if node.op_type not in RANDOM_OPS and all(
                        t in self.initializers or self.producer.get(t) in made
                        for t in node.reads):
                    made.add(node.name)
            found = self.memo["constant_nodes"] = frozenset(made)
        return found

    def is_constant(self, tensor: str) -> bool:
        """A weight, or a tensor made from weights alone: the same every request."""
        found = self.memo.get("constant_tensors")
        if found is None:
            made = (t for n in self.nodes if n.name in self.constant_nodes for t in n.writes
                    if (kind := self.types.get(t)) is not None
                    and kind.WhichOneof("value") == "tensor_type")
            found = self.memo["constant_tensors"] = frozenset([*self.initializers, *made])
        return tensor in found

    def declared_dims(self, names: Iterable[str]) -> dict[str, tuple[Dim, ...] | None]:
        """name -> its declared dimensions (symbolic names kept), None when unknown. A
        sequence of maps (a classifier's ZipMap: one map a row) has one, `rows`."""
        return {n: ("rows",) if self._map_per_row(n) else self.tensors[n].dims
                if n in self.tensors else None for n in names}

    def _map_per_row(self, name: str) -> bool:
        kind = self.types.get(name)
        return kind is not None and kind.WhichOneof("value") == "sequence_type" and \
            kind.sequence_type.elem_type.WhichOneof("value") == "map_type"

    def tensor_bytes(self, tensor: str) -> int:
        info = self.tensors.get(tensor)
        return info.nbytes if info else 0


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _read(source: str | Path | bytes | onnx.ModelProto, max_bytes: int | None
          ) -> onnx.ModelProto:
    """A ModelProto from a path, serialized bytes or a ModelProto (copied: a loaded graph's
    model, its shells as they are). A file's weights of 1 KB or more are shells from the
    start, none read: those in the .onnx file (`_parsed`) and in external data files
    (`external_shells`). `max_bytes`: a file, with its external data, larger than this
    (and than READ_ANYWAY) is refused before any of it is read."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        return model
    if isinstance(source, bytes | bytearray):
        try:
            return disowned(onnx.load_from_string(bytes(source)))
        except Exception as exc:
            raise ModelLoadError(f"bytes given are not an ONNX model: {_one_line(exc)}") from None
    path = Path(source)
    try:
        if not path.exists():
            raise ModelLoadError(f"model file not found: {path}")
        if path.is_dir():
            raise ModelLoadError(f"model path is a folder, not an ONNX file: {path}")
        size = path.stat().st_size
    except OSError as exc:  # e.g. a name too long
        raise ModelLoadError(f"cannot open model {path}: {exc.strerror or exc}") from None
    _check_size(path, size, max_bytes)
    try:
        model = _parsed(path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not an ONNX model: {_one_line(exc)}") from None
    _check_size(path, size + _external_bytes(model, path.parent), max_bytes)
    try:
        external_shells(model, str(path.parent))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot read its external data: {_one_line(exc)}"
                             ) from None
    return model


def _parsed(path: Path) -> onnx.ModelProto:
    """The model in the file, its weights left in it and in its external data files: a
    protobuf file parsed from a mapping of it, its raw weights skipped (`stored.parsed`).
    onnx.load reads the bytes into memory first, then parses a copy of them: a peak of
    twice the file (a 384 MB model loaded at 769 MB of the process's own memory)."""
    if registry.get_format_from_file_extension(path.suffix) not in (None, "protobuf"):
        return disowned(onnx.load(str(path), load_external_data=False))  # a text format
    return parsed(path)


def _check_size(path: Path, size: int, max_bytes: int | None) -> None:
    """Refuse a model over `max_bytes`, unless it is small enough to read anyway (then the
    plan says which node does not fit on which device)."""
    if max_bytes is not None and size > max(max_bytes, READ_ANYWAY):
        raise DeviceMemoryError(f"{path} holds {size} bytes ({human_bytes(size)}) of model, "
                                f"more than the {max_bytes} bytes ({human_bytes(max_bytes)}) "
                                f"free on the devices it may load onto; not read")


def external_data(model: onnx.ModelProto) -> Iterator[external_data_helper.ExternalDataInfo]:
    """Where each of a model's tensors kept in an external file is: its file (`location`,
    relative to the model's folder), `offset` and `length`; a Prism shell is not one."""
    for tensor in external_data_helper._get_all_tensors(model):
        if external_data_helper.uses_external_data(tensor) and stored_at(tensor) is None:
            yield external_data_helper.ExternalDataInfo(tensor)


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset, None if it imports none."""
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def file_bytes(path: str | Path) -> int:
    """A model file's bytes with the external data it names (none of which is read)."""
    path = Path(path)
    return path.stat().st_size + _external_bytes(_parsed(path), path.parent)


def _external_bytes(model: onnx.ModelProto, folder: Path) -> int:
    """The bytes a model's tensors keep in external files, from their lengths (or the
    files' sizes), nothing read."""
    total = 0
    for info in external_data(model):
        if info.length:
            total += info.length
        else:
            with contextlib.suppress(OSError):  # a missing file: the load says so
                total += max(0, (folder / info.location).stat().st_size - (info.offset or 0))
    return total


# a tensor's fields that hold text; the rest is data, which fetching would copy
_TENSOR_TEXT = [fd for fd in onnx.TensorProto.DESCRIPTOR.fields
                if fd.type in (fd.TYPE_STRING, fd.TYPE_MESSAGE)]


def _not_text(message: Message, where: str) -> str | None:
    """The first string field (as `graph.node[3].name`) whose bytes are not UTF-8, or None.
    protobuf hands such a field back as bytes, not str, and onnx's checker fails on it
    with a UnicodeDecodeError."""
    fields = ([(fd, getattr(message, fd.name)) for fd in _TENSOR_TEXT]
              if isinstance(message, onnx.TensorProto) else message.ListFields())
    for fd, value in fields:
        if fd.type not in (fd.TYPE_STRING, fd.TYPE_MESSAGE):
            continue
        many = not isinstance(value, str | bytes | Message)
        for i, item in enumerate(value if many else [value]):
            at = f"{where}.{fd.name}" + (f"[{i}]" if many else "")
            if isinstance(item, bytes):
                return at
            if isinstance(item, Message) and (found := _not_text(item, at)):
                return found
    return None


def _check(model: onnx.ModelProto, label: str, source: object) -> None:
    bad = _not_text(model, "model")
    if bad is not None:
        raise ModelLoadError(f"{label}: {bad} is not UTF-8 text")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"{label}: IR version {model.ir_version} is newer than this onnx "
                             f"reads (up to {onnx.IR_VERSION})")
    newest = onnx.defs.onnx_opset_version()
    for op in model.opset_import:
        if op.domain in DEFAULT_DOMAINS and not 1 <= op.version <= newest:
            raise ModelLoadError(f"{label}: unsupported opset {op.version} of ai.onnx "
                                 f"(this onnx knows 1..{newest})")
    unmade = _unmade_read(model.graph)
    if unmade:  # the checker's words for it ("must be topologically sorted") mislead here
        raise ModelLoadError(f"{label} fails the ONNX checker: {unmade}")
    foreign = _onnxruntime_only(model)
    domains = [node.domain for node in foreign]
    for node in foreign:  # the checker skips a domain it does not know
        node.domain = ONNXRUNTIME_ONLY
    if foreign:
        model.opset_import.add(domain=ONNXRUNTIME_ONLY, version=1)
    # the checker wants a shape on the graph's inputs and outputs, where onnxruntime reads
    # none as a tensor of any rank: a one-dimension placeholder, for the check only
    shapeless = [v for v in (*model.graph.input, *model.graph.output)
                 if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    for value in shapeless:
        value.type.tensor_type.shape.dim.add(dim_param="any")
    # below IR 4 the checker wants every initializer listed as an input; onnxruntime not
    ir_version = model.ir_version
    model.ir_version = 4 if 0 < ir_version < 4 else ir_version
    try:
        if too_large(model) and isinstance(source, str | Path) and not foreign:
            onnx.checker.check_model(str(source))  # its files: their data is not read
        else:
            checked(model, frozenset(t.name for t in model.graph.initializer if stored_at(t)))
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"{label} fails the ONNX checker: {_one_line(exc)}") from None
    finally:
        for node, domain in zip(foreign, domains, strict=True):
            node.domain = domain
        if foreign:
            del model.opset_import[-1]
        for value in shapeless:
            value.type.tensor_type.ClearField("shape")
        model.ir_version = ir_version


def _unmade_read(graph: onnx.GraphProto) -> str | None:
    """Why a node of the (sorted) graph reads a tensor before anything makes it: nothing
    does (a node dropped), or a node after it does (a cycle), or None. The checker says
    "must be topologically sorted" for both, which `sort_nodes` has already done."""
    made = {"", *(v.name for v in graph.input), *(t.name for t in graph.initializer),
            *(t.values.name for t in graph.sparse_initializer)}
    maker = {t: n for n in graph.node for t in n.output}
    for i, node in enumerate(graph.node):
        for name in reads_of(node):
            if name in made:
                continue
            reader = f"node {node.name or i} ({node.op_type}) reads {name!r}"
            if name in maker:
                return (f"{reader}, made by node {maker[name].name or maker[name].op_type}, "
                        f"which cannot run before it: the graph has a cycle")
            return f"{reader}, which no node, initializer or graph input makes"
        made.update(node.output)
    return None


ONNXRUNTIME_ONLY = "prism.onnxruntime-only"  # where the checker sees the ops below


def _onnxruntime_only(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of ai.onnx ops onnx has no schema for at the model's opset and onnxruntime's
    CPU provider runs there: its transformer optimizer's SimplifiedLayerNormalization (T5's
    and Llama's RMS norm), and the LayerNormalization it writes below opset 17, where
    onnx defines none (BERT and GPT-2 exports at opset 14, optimized); the experimental ops
    of old models (ImageScaler, Crop, Affine, ScaledTanh, ...). onnxruntime runs such a
    model, so Prism checks the rest of it."""
    opset = default_opset(model) or 1
    unknown = [n for n in nested_nodes(model.graph)
               if n.domain in DEFAULT_DOMAINS and not onnx.defs.has(n.op_type, opset)]
    if not unknown:
        return []
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

    runs = {k.op_name for k in get_all_opkernel_def()
            if k.domain in DEFAULT_DOMAINS and k.provider == "CPUExecutionProvider"
            and k.version_range[0] <= opset <= k.version_range[1]}
    return [n for n in unknown if n.op_type in runs]


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give unnamed or clashing nodes stable unique names: `<op>_<index>`."""
    seen: set[str] = set()
    taken = {n.name for n in graph.node if n.name}
    for i, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = fresh_name(f"{node.name or node.op_type}_{i}", taken)
        seen.add(node.name)


def _drop_empty_trailing_inputs(graph: onnx.GraphProto) -> None:
    """`LayerNormalization(x, scale, "")` and `LayerNormalization(x, scale)` mean the same
    (trailing optional inputs may be left out), but onnxruntime 1.32's optimizer crashes
    the process on the first: every node loses its empty trailing inputs, in subgraphs too."""
    for node in graph.node:
        while node.input and not node.input[-1]:
            del node.input[-1]
        for sub in subgraphs(node):
            _drop_empty_trailing_inputs(sub)


def _free_negative_dims(graph: onnx.GraphProto) -> None:
    """A dimension declared -1 (PaddlePaddle's exporter writes its dynamic batch so) is
    free to onnxruntime, as one with no value: made so, in place."""
    for value in (*graph.input, *graph.output, *graph.value_info):
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.Clear()


def copy_initializer(graph: onnx.GraphProto, source: onnx.TensorProto, name: str) -> None:
    """A copy of `source` in `graph`'s initializers under `name`: a reader's own."""
    own = onnx.TensorProto()
    own.CopyFrom(source)
    own.name = name
    graph.initializer.append(own)


def unlist_initializers(model: onnx.ModelProto, *, in_place: bool = False
                        ) -> onnx.ModelProto:
    """The model with no initializer among its graph's inputs, where older exporters list
    every weight (IR 3 required it; it moves to IR 4, which does not). Prism takes no feed
    for a weight; onnxruntime takes a listed one for an input it may be fed, so it neither
    folds nor prepacks it, and its quantizer's optimizer drops the weights it folds but
    not their names among the inputs, which nobody then feeds. `model` itself when it
    lists none or `in_place` (a copy of the caller's own: its weights are not copied
    again), else a copy."""
    weights = {t.name for t in model.graph.initializer}
    if not any(i.name in weights for i in model.graph.input):
        return model
    out = model if in_place else copy.deepcopy(model)
    kept = [i for i in out.graph.input if i.name not in weights]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.ir_version = max(out.ir_version, 4)
    return out


def subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def nested_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph (a model's or a subgraph), its subgraphs' too."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from nested_nodes(sub)


def body_ops(graph: onnx.GraphProto) -> Iterator[tuple[str, str]]:
    """(domain, op type) of every node of a graph, its subgraphs' too."""
    return ((node.domain, node.op_type) for node in nested_nodes(graph))


def reads_of(node: onnx.NodeProto) -> tuple[str, ...]:
    """Every tensor a node reads: its inputs, then what its subgraphs (If, Loop, Scan)
    read from the scope around it."""
    inner = (r for sub in subgraphs(node) for r in _outer_reads(sub))
    return tuple(dict.fromkeys(r for r in (*node.input, *inner) if r))


def sort_nodes(graph: onnx.GraphProto) -> None:
    """Put the graph's nodes in an order where each comes after the nodes making what it
    reads, its subgraphs' reads from around it included, as ONNX asks (onnxruntime sorts
    a graph itself, and its quantizer writes a Loop before the node making what its body
    reads). Stable: a node sorted already keeps its place. Nodes that cannot be ordered
    (a cycle, a read nothing makes) keep theirs, after the rest, for the checker to name."""
    nodes = list(graph.node)
    maker = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    waits = [{maker[r] for r in reads_of(n) if r in maker} - {i} for i, n in enumerate(nodes)]
    if all(w < i for i, wait in enumerate(waits) for w in wait):
        return
    readers: dict[int, list[int]] = {}
    for i, wait in enumerate(waits):
        for w in wait:
            readers.setdefault(w, []).append(i)
    ready = [i for i, wait in enumerate(waits) if not wait]
    heapq.heapify(ready)
    left, order = [len(w) for w in waits], []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            left[r] -= 1
            if not left[r]:
                heapq.heappush(ready, r)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads that it does not define itself (outer scope), in order."""
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    local |= {t.values.name for t in graph.sparse_initializer}
    reads: dict[str, None] = {}
    for node in graph.node:
        for name in reads_of(node):
            if name not in local:
                reads[name] = None
        local.update(node.output)
    for out in graph.output:
        if out.name not in local:
            reads[out.name] = None
    return list(reads)


def _dims(value: onnx.ValueInfoProto) -> tuple[int, tuple[Dim, ...] | None]:
    """Its element type and dims; a negative size, which shape inference gives a window
    larger than its input (onnxruntime refuses that node), is an unknown one."""
    t = value.type
    if not t.HasField("tensor_type"):
        return 0, None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
        else:
            dims.append(d.dim_param or None)
    return tt.elem_type, tuple(dims)


def _np_dtype(elem_type: int) -> str | None:
    if not elem_type:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None


def _bind(dims: tuple[Dim, ...] | None, bindings: Mapping[str, int], default: int) -> tuple[
        int, ...] | None:
    if dims is None:
        return None
    return tuple(d if isinstance(d, int) else
                 int(bindings.get(d, default)) if isinstance(d, str) else default for d in dims)


def _infer(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Value infos of `model` (an `inferable` one) by onnx's shape inference."""
    try:
        inferred = shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                data_prop=True)
    except Exception:  # inference is best effort; unknown shapes cost by fallback
        inferred = model
    g = inferred.graph
    known = {v.name: v for v in (*g.value_info, *g.input, *g.output)}
    extra = contrib_value_infos(model, known)
    if extra and model is not inferred:
        typed = copy.deepcopy(model)
        typed.graph.value_info.extend(extra)
        return {**_infer(typed), **{v.name: v for v in extra}}
    return known


_GUESSES_RUN_MOST = 64 << 20  # bytes of inputs at which a load runs a model for its sizes
_MADE_UP_MOST = 1 << 30  # bytes of one tensor a made-up image's sides may make
_SIDE_LEAST = 32  # the side made-up image sides halve to at the least (stride 32)


def _bound_within(shapes: onnx.ModelProto, least: dict[str, dict[int, int]],
                  bindings: Mapping[str, int], default: int
                  ) -> tuple[dict[str, int], dict[str, onnx.ValueInfoProto]]:
    """The free dimensions' sizes (`free_sizes`) and the value infos at them. Made-up image
    sides halve while a tensor at them would pass `_MADE_UP_MOST`, their new sides kept
    in `least` (so made-up feeds take them): a diffusion UNet or VAE decoder attends over
    every latent pixel, 10 to 80 GB of scores at 224 a side, and a run there was killed
    for want of memory."""
    shaped = list(shaped_inputs(shapes.graph))
    made_up = [(value.name, axis, str(dims[axis])) for value, dims, floating in shaped
               for axis in image_sides(dims, floating, least.get(value.name, {}))
               if isinstance(dims[axis], str) and dims[axis] not in bindings]
    while True:
        sizes = free_sizes(((value.name, dims, floating, least.get(value.name, {}))
                            for value, dims, floating in shaped), bindings, default)
        bound_model = _bound_model(shapes, sizes, default)
        side = min((sizes[dim] for _, _, dim in made_up), default=0)
        halves = side // 2 >= _SIDE_LEAST
        if not halves or max((t.nbytes for t in _input_tensors(bound_model.graph)),
                             default=0) <= _MADE_UP_MOST:  # an input past it halves them now
            _check_held(bound_model.graph)
            bound = sharpened(bound_model, _infer(bound_model))
            if not halves or _largest_bytes(bound) <= _MADE_UP_MOST:
                return sizes, bound
        for name, axis, _ in made_up:
            least.setdefault(name, {})[axis] = side // 2


def _largest_bytes(values: Mapping[str, onnx.ValueInfoProto]) -> int:
    """The bytes of the largest tensor of known shape among `values`."""
    largest = 0
    for value in values.values():
        elem, dims = _dims(value)
        dtype = _np_dtype(elem)
        sized = tuple(d for d in dims or () if isinstance(d, int))
        if dims and len(sized) == len(dims):
            largest = max(largest, Tensor(value.name, dtype, sized, dims, elem).nbytes)
    return largest


def _input_tensors(graph: onnx.GraphProto) -> list[Tensor]:
    """The graph's inputs of known element type, a free dimension 1 (the least it takes)."""
    return [Tensor(value.name, dtype, tuple(d if isinstance(d, int) else 1 for d in dims),
                   tuple(dims), elem) for value, dims, _ in shaped_inputs(graph)
            if (dtype := _np_dtype(elem := value.type.tensor_type.elem_type))]


def _check_held(graph: onnx.GraphProto) -> None:
    """A request's inputs are held in this process: one past the machine's memory (a size
    bound by mistake, `--bind batch=10000000`) is refused before shape inference, which
    at such sizes ran for minutes, until the kernel killed it for want of memory."""
    memory = machine_bytes()
    for t in _input_tensors(graph):
        if memory is not None and t.nbytes > memory:
            raise DeviceMemoryError(
                f"input {t.name} at {list(t.shape or ())} needs {human_bytes(t.nbytes)}; "
                f"{memory_text(memory)} (other sizes with --bind DIM=N, or bindings)")


def _bound_model(model: onnx.ModelProto, sizes: Mapping[str, int], default: int
                 ) -> onnx.ModelProto:
    """A copy of `model` whose inputs have the shapes the graph is costed at, the ones
    made-up inputs take (`free_dims`)."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for value, dims, floating in shaped_inputs(bound.graph):
        shape = made_up_shape(dims, floating, sizes, default)
        for d, size in zip(value.type.tensor_type.shape.dim, shape, strict=True):
            if not d.HasField("dim_value"):
                d.dim_value = size
    return bound


def _size_unknowns(tensors: dict[str, Tensor], model: onnx.ModelProto,
                   sizes: Mapping[str, int], default: int, guessed: set[str],
                   others: set[str]) -> None:
    """Node outputs shape inference left without a size, or with one it could not compute
    (`guessed`: bound to `default`): sized by a run (`run_sizes`, kept between loads),
    unless the model is past 2 GB, which onnxruntime cannot be handed whole. Where its
    known tensors together pass half the machine's memory, it is not run (a run at load
    could meet the kernel's OOM killer), only typed as onnxruntime loads it. Guessed
    sizes are run for where the inputs are a request's worth (`_GUESSES_RUN_MOST`: a
    Swin bound to a batch of 1,000 took 20 s and 8 GB to run); one the run makes 0 (an
    expert no made-up token was routed to) stays guessed. Symbolic inference stops short
    of ops it has no rule for (14 of 78 real exports, before `symbolic_sizes._WHOLE_OPS`
    and `_REDUCES`, had their tokens costed as one). `others` are no tensors (a
    SplitToSequence's sequence): a run does not size them, and they are not run for."""
    unknown = [t for node in model.graph.node for t in node.output if t and t not in others
               and (t not in tensors or tensors[t].shape is None or tensors[t].dtype is None)]
    fed = sum(tensors[v.name].nbytes for v in model.graph.input if v.name in tensors)
    if fed <= _GUESSES_RUN_MOST:
        unknown += sorted(guessed.difference(unknown))
    if not unknown or too_large(model):
        return
    memory = machine_bytes()
    held = sum(t.nbytes for t in tensors.values())  # every tensor known, at once: at most
    runs = memory is None or held <= memory // 2  # else typed as onnxruntime loads it alone
    for t, (dtype, shape) in kept_sizes(_bound_model(model, sizes, default), unknown,
                                        runs).items():
        old = tensors.get(t)
        if shape is None or (0 in shape and t in guessed):  # a type alone, or an empty guess
            shape = old.shape if old else None
        tensors[t] = Tensor(t, dtype.name, shape, old.dims if old else None,
                            old.elem_type if old and old.elem_type else
                            helper.np_dtype_to_tensor_dtype(dtype))


def densify_sparse(model: onnx.ModelProto) -> None:
    """The main graph's sparse initializers made dense initializers, in place, as
    onnxruntime makes them as it loads: every pass and device reads a weight one way."""
    for sparse in model.graph.sparse_initializer:
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
        dims = tuple(int(d) for d in sparse.dims)
        dense = np.zeros(math.prod(dims), values.dtype)
        dense[indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, dims)] = values
        model.graph.initializer.append(numpy_helper.from_array(dense.reshape(dims),
                                                               sparse.values.name))
    del model.graph.sparse_initializer[:]


def inline_functions(model: onnx.ModelProto) -> None:
    """The model's own functions replaced by their bodies, in place, as onnxruntime inlines
    them as it loads: a network exported with its modules as functions (torch's
    `export_modules_as_functions`) is one call node at the top, which no device could be
    given part of, and which onnx's evaluator and training did not run. Inlined on a copy
    whose weights are their types alone, so none is copied or serialized for it."""
    if not model.functions:
        return
    inlined = inliner.inline_local_functions(shell(model, typed_only, 0))
    del model.graph.node[:]
    model.graph.node.extend(inlined.graph.node)
    del model.functions[:]


def holds_half(model: onnx.ModelProto) -> bool:
    """Whether the main graph declares a float16 tensor (an input, output, weight, typed
    value or Cast target): its sessions skip `devices.ort.options.HALF_DISABLED`."""
    half = onnx.TensorProto.FLOAT16
    graph = model.graph
    typed = (*graph.input, *graph.output, *graph.value_info)
    return (any(v.type.tensor_type.elem_type == half for v in typed)
            or any(t.data_type == half for t in graph.initializer)
            or any(a.name == "to" and a.i == half for n in graph.node if n.op_type == "Cast"
                   for a in n.attribute))


def load_graph(source: str | Path | bytes | onnx.ModelProto | Graph, *,
               bindings: Mapping[str, int] | None = None, default_dim: int = 1,
               name: str | None = None, max_bytes: int | None = None, fold: bool = True,
               owned: bool = False) -> Graph:
    """Read, check, name, fold and shape a model. `bindings` maps symbolic dims to values.
    `max_bytes`: a model file larger is refused unread (`_read`). `fold`: compute
    every tensor that depends on constants alone now (`runtime.fold`), so no such node is
    work and no such tensor crosses devices per request. `owned`: a ModelProto given is
    the caller's no longer, and becomes the graph's model as it is, not a copy (its
    weights held once, not twice: a block PyTorch offloads).
    A Graph already loaded (with the same bindings) is reused, renamed if asked."""
    if isinstance(source, Graph):
        if not bindings or dict(bindings) == source.bindings:
            graph = copy.copy(source)  # shares the model, tensors and memo; not re-checked
            graph.name = name or source.name
            return graph
        source = source.model
    model = source if owned and isinstance(source, onnx.ModelProto) \
        else _read(source, max_bytes)
    label = str(source) if isinstance(source, str | Path) else "model"
    sort_nodes(model.graph)
    _check(model, label, source)
    densify_sparse(model)
    inline_functions(model)
    name_nodes(model.graph)
    _drop_empty_trailing_inputs(model.graph)
    _free_negative_dims(model.graph)
    unlist_initializers(model, in_place=True)  # _read's copy
    _check_held(model.graph)  # as declared, before folding infers its shapes
    report = fold_constants(model) if fold else FoldReport()
    one_reader_each(model.graph)  # as onnxruntime, before a cut can split a QDQ group
    bindings = dict(bindings or {})
    least = least_sizes(model.graph)
    shapes = inferable(model)
    declared = _infer(shapes)
    sizes, bound = _bound_within(shapes, least, bindings, default_dim)
    tensors: dict[str, Tensor] = {}
    guessed: set[str] = set()  # sized `default_dim` where inference left a size unknown
    others: set[str] = set()  # no tensor (a sequence, a map): no run sizes it
    for init in model.graph.initializer:
        shape = tuple(int(d) for d in init.dims)
        tensors[init.name] = Tensor(init.name, _np_dtype(init.data_type), shape, shape,
                                    init.data_type)
    for tname in {*declared, *bound}:
        if tname in tensors:
            continue
        value = declared.get(tname) or bound[tname]
        elem, dims = _dims(value)
        belem, bdims = _dims(bound.get(tname) or declared[tname])
        if value.type.WhichOneof("value") not in (None, "tensor_type"):
            others.add(tname)
        elem = elem or belem
        costed = bdims if bdims is not None else dims
        tensors[tname] = Tensor(tname, _np_dtype(elem), _bind(costed, sizes, default_dim), dims,
                                elem)
        if any(isinstance(d, str) and d not in sizes for d in costed or ()):
            guessed.add(tname)
    _size_unknowns(tensors, model, sizes, default_dim, guessed, others)
    g = model.graph
    initializers = {t.name: t for t in g.initializer}
    nodes = []
    for i, proto in enumerate(g.node):
        outer = tuple(r for r in reads_of(proto) if r not in proto.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        body = tuple(dict.fromkeys(op for sub in subgraphs(proto) for op in body_ops(sub)))
        nodes.append(Node(proto.name, proto.op_type, proto.domain, tuple(proto.input),
                          tuple(proto.output), attrs, outer, i, body))
    opsets = {op.domain or "": op.version for op in model.opset_import}
    graph_inputs = [v.name for v in g.input if v.name not in initializers]
    # copies: a part of the inferred model would keep all of it (its weights) alive
    types = {t: copy.deepcopy(v.type) for t, v in declared.items() if v.type.WhichOneof("value")}
    # a tensor typed by a run alone (`_size_unknowns`) is declared by its element type
    for tname, info in tensors.items():
        if tname not in types and tname not in initializers and info.elem_type:
            types[tname] = helper.make_tensor_type_proto(info.elem_type, None)
    return Graph(model=model, nodes=nodes, tensors=tensors, initializers=initializers,
                 inputs=graph_inputs, outputs=[v.name for v in g.output], opsets=opsets,
                 bindings=bindings, name=name or g.name or "network", types=types,
                 folded=report, opened=kept_open(model), least=least)

