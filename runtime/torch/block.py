"""A block at run time: exported on its first call for each kind of input, added to the
host as a network, run there; PyTorch runs it instead whenever Prism cannot.

Each export is a variant, kept while calls fit it: the same dtypes and the dimensions the
model fixes (a block of a dynamic graph exports with dynamic dimensions, so one variant
serves every batch size), the same ints where the model fixed an int, and the same weights
(parameter and buffer objects at the version exported; a weight changed in place, by an
optimizer step or `load_state_dict`, makes the block export again with its weights as
inputs fed on every call). A block whose export fails, whose ONNX no device runs and
cannot be split, whose outputs would differ in dtype or shape from PyTorch's, or whose
run fails, runs in PyTorch from then on, after a one-line `OffloadWarning`.
"""

from __future__ import annotations

import ast
import contextlib
import operator
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx
import torch
from torch.fx import GraphModule, Node

from runtime.errors import PrismError, first_line
from runtime.graph import Graph, load_graph
from runtime.partition.placement import unsupported
from runtime.partition.planning import plan_network
from runtime.torch.export import ExportedBlock, ExportFailed, export_block
from runtime.torch.report import BlockRecord, GraphReport, NodeRecord, VariantRecord
from runtime.torch.split import Split, operators, split
from runtime.torch.support import NodeSupport, op_label
from runtime.torch.tensors import laid_out, layout_of, to_numpy, to_torch
from runtime.types import check_batchable

if TYPE_CHECKING:
    from runtime.devices.config import DeviceConfig
    from runtime.host.manager import HostManager
    from runtime.partition.plan import Plan
    from runtime.torch.options import OffloadOptions


MAX_SPLITS = 16  # blocks split out of blocks, at most this deep


class OffloadWarning(UserWarning):
    """A block, or part of one, runs in PyTorch instead of on Prism's devices."""


class _Mismatch(Exception):
    """A block's outputs are not what PyTorch would make (dtype, rank, fixed size)."""


def _stamp(tensor: torch.Tensor) -> tuple[int, int]:
    """What changes when a weight does: its version (an in-place write; an inference
    tensor keeps none) and its storage (`p.data = new`). A write through `p.data` in
    place changes neither: such a weight is seen as unchanged."""
    return (-1 if tensor.is_inference() else tensor._version, tensor.data_ptr())


@dataclass
class Context:
    """What every block of one graph shares."""

    graph: str                      # the graph's name in reports and network names
    options: OffloadOptions
    host: HostManager | None        # None in a dry run: nothing is added to a host
    devices: list[DeviceConfig]
    report: GraphReport
    networks: list[str] = field(default_factory=list)  # added to the host, in order


def is_weight(value: object) -> bool:
    """A parameter or buffer: dynamo marks the ones it lifts into graph inputs."""
    return isinstance(value, torch.nn.Parameter) or hasattr(value, "_dynamo_static_input_type")


def _numpy_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


@dataclass(frozen=True)
class Expected:
    """What PyTorch makes for one block output: dtype, dimensions (None where symbolic),
    the layout in memory the rest of the graph was traced with."""

    dtype: np.dtype
    dims: tuple[int | None, ...]
    layout: tuple[int, ...] | None

    @cached_property
    def empty(self) -> bool:
        """Does PyTorch make it empty (a dimension fixed at 0)? It holds no values then, and
        is made so whatever the ONNX makes: torch.onnx's batch norm out of training makes
        the running statistics where PyTorch saves empty ones for its backward."""
        return None not in self.dims and 0 in self.dims

    def problem(self, array: np.ndarray) -> str | None:
        if array.dtype != self.dtype or array.ndim != len(self.dims) or any(
                d is not None and d != s for d, s in zip(self.dims, array.shape, strict=True)):
            return f"{array.dtype}{list(array.shape)} where PyTorch makes " \
                   f"{self.dtype}{list(self.dims)}"
        return None


def _expected(gm: GraphModule) -> tuple[Expected, ...]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    out = []
    for node in output.args[0]:
        fake = node.meta["val"]
        out.append(Expected(torch.empty((), dtype=fake.dtype).numpy().dtype,
                            tuple(s if isinstance(s, int) else None for s in fake.shape),
                            layout_of(fake)))
    return tuple(out)


@dataclass
class Variant:
    network: str | None             # None in a dry run
    exported: ExportedBlock
    dtypes: tuple[torch.dtype, ...]  # of the fed tensors
    weights: tuple[tuple[int, torch.Tensor, tuple[int, int]], ...]  # (position, tensor,
    # `_stamp`) of each weight baked in
    expected: tuple[Expected, ...]

    def accepts(self, args: Sequence[Any]) -> bool:
        for (_, pos), dims, dtype in zip(self.exported.inputs, self.exported.dims,
                                         self.dtypes, strict=True):
            arg = args[pos]
            if not isinstance(arg, torch.Tensor) or arg.dtype != dtype \
                    or arg.dim() != len(dims):
                return False
            if any(d is not None and d != s for d, s in zip(dims, arg.shape, strict=True)):
                return False
        return all(args[pos] == value for pos, value in self.exported.fixed)

    def current(self, args: Sequence[Any]) -> bool:
        """Are the weights the ones exported, unchanged?"""
        return all(args[pos] is tensor and _stamp(tensor) == stamp
                   for pos, tensor, stamp in self.weights)

    def run(self, host: HostManager, network: str, args: Sequence[Any]
            ) -> tuple[torch.Tensor, ...]:
        outputs = host.infer(network, _feeds(self.exported, args))
        result = []
        for name, expected in zip(self.exported.outputs, self.expected, strict=True):
            array = outputs[name]
            if expected.empty:
                array = np.empty(cast(tuple[int, ...], expected.dims), expected.dtype)
            elif (wrong := expected.problem(array)) is not None:
                raise _Mismatch(f"output {name} is {wrong}")
            result.append(laid_out(to_torch(array, copy=name in self.exported.constants),
                                   expected.layout))
        return tuple(result)


class OffloadedBlock(torch.nn.Module):
    """Stands in the split graph where the block's submodule was."""

    def __init__(self, name: str, gm: GraphModule, nodes: list[str], ctx: Context,
                 parent: str | None = None):
        super().__init__()
        self.gm = gm
        self.block, self.ctx = name, ctx
        self.record = BlockRecord(name, nodes, parent=parent)
        ctx.report.blocks[name] = self.record
        self.variants: list[Variant] = []
        self._by_key: dict[tuple, Variant] = {}
        self._weights: frozenset[int] | None = None  # positions of weights, at the first call
        self._feed_weights = False
        self.fallen: str | None = None
        self.inner: GraphModule | None = None  # the block split around nodes no device runs
        self._lock = threading.RLock()

    # -- the call ------------------------------------------------------------------------

    def forward(self, *args: Any) -> Any:
        if self.inner is not None:
            return self.inner(*args)
        if self.fallen is not None:
            return self.gm(*args)
        variant: Variant | None = self._by_key.get(self._key(args))
        if variant is None or not variant.current(args):
            variant = self._choose(args)
            if variant is None:
                return (self.inner or self.gm)(*args)
        if variant.network is None or self.ctx.host is None:  # a dry run
            return self.gm(*args)
        try:
            return variant.run(self.ctx.host, variant.network, args)
        except (PrismError, _Mismatch) as exc:
            self._fall(f"its run on Prism failed: {first_line(exc)}")
            return self.gm(*args)

    def _key(self, args: Sequence[Any]) -> tuple:
        if self._weights is None:
            self._weights = frozenset(i for i, a in enumerate(args) if is_weight(a))
        skip = () if self._feed_weights else self._weights
        return tuple((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args) if i not in skip)

    def _choose(self, args: Sequence[Any]) -> Variant | None:
        """The variant for these arguments: one that fits, else a new export (None if
        the block now runs in PyTorch, or split)."""
        with self._lock:
            if self.fallen is not None or self.inner is not None:
                return None
            key = self._key(args)
            for variant in self.variants:
                if variant.accepts(args) and variant.current(args):
                    self._by_key[key] = variant
                    return variant
            if any(v.accepts(args) for v in self.variants):  # the weights changed
                self._feed_weights = True
                self._drop_variants()
                self.record.state = "weights changed after export: fed on every call"
                key = self._key(args)
            made = self._export(args)
            if made is not None:
                self._by_key[key] = made
            return made

    # -- export, check, add --------------------------------------------------------------

    def _export(self, args: Sequence[Any]) -> Variant | None:
        tensors = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        baked = frozenset() if self._feed_weights else (self._weights or frozenset())
        if tensors <= baked:  # weights alone: a model needs something to feed
            baked = frozenset()
        try:
            exported = export_block(self.gm, args, baked,
                                    self.ctx.options.custom_translation_table)
        except ExportFailed as exc:
            culprits = [n.name for n in operators(self.gm) if op_label(n) == exc.op]
            if culprits and len(culprits) < len(self.record.nodes):
                self._split_around(dict.fromkeys(culprits, f"ONNX export failed at it: "
                                                           f"{exc.cause}"))
            else:
                self._fall(f"ONNX export failed at {exc.op or 'the block'} ({exc.cause})")
            return None
        expected = _expected(self.gm)
        for name, want, proto in zip(exported.outputs, expected, exported.model.graph.output,
                                     strict=True):
            made = _numpy_dtype(proto.type.tensor_type.elem_type)
            if made != want.dtype:
                self._fall(f"its ONNX makes {made} for {name} where PyTorch makes {want.dtype}")
                return None
        name = f"torch.{self.ctx.graph}.{self.block}" + (
            f".v{len(self.variants) + 1}" if self.variants else "")
        try:
            graph = load_graph(exported.model, bindings=_bindings(exported, args), name=name,
                               owned=True)
        except PrismError as exc:
            self._fall(f"Prism cannot load its ONNX: {first_line(exc)}")
            return None
        if stuck := self._unrunnable(graph):
            excluded = self._traced_back(graph, stuck)
            if excluded is None:
                self._fall(f"no device runs what it becomes ({next(iter(stuck.values()))})")
            else:
                self._split_around(excluded)
            return None
        plan = self._place(name, graph, _feeds(exported, args))
        if plan is None:
            return None
        variant = Variant(None if self.ctx.host is None else name, exported,
                          tuple(args[pos].dtype for _, pos in exported.inputs),
                          tuple((i, args[i], _stamp(args[i])) for i in sorted(baked)),
                          expected)
        self.variants.append(variant)
        self.record.variants.append(VariantRecord(
            name, {n: list(d) for (n, _), d in zip(exported.inputs, exported.dims, strict=True)},
            exported.seconds, plan, loaded=self.ctx.host is not None))
        if self.record.state.startswith("waiting"):
            self.record.state = "dry run: planned, runs in PyTorch" if self.ctx.host is None \
                else "offloaded"
        return variant

    def _place(self, name: str, graph: Graph, feeds: dict[str, np.ndarray]) -> Plan | None:
        """Add the network to the host (or, in a dry run, only plan it): its plan, or None
        if the block falls back. Its costs are measured on `feeds`, the call's own tensors
        (made-up values can be ones it refuses: a box's image index of -1)."""
        options = self.ctx.options
        partition = options.partition or "balanced"
        if self.ctx.host is None:
            try:
                return plan_network(graph, self.ctx.devices, partition,
                                    replicas=options.replicas or 1, sample_feeds=feeds)[1]
            except PrismError as exc:
                self._fall(f"Prism cannot plan it: {first_line(exc)}")
                return None
        batching = options.batching
        if batching is not None:
            try:
                check_batchable(name, graph.declared_dims(graph.inputs),
                                graph.declared_dims(graph.outputs))
            except PrismError as exc:
                self._warn(f"runs unbatched: {first_line(exc)}")
                batching = None
        try:
            plan = self.ctx.host.add_network(name, graph, partition=partition,
                                             replicas=options.replicas, batching=batching,
                                             timeout=options.timeout, sample_feeds=feeds)
        except PrismError as exc:
            self._fall(f"the host cannot take it: {first_line(exc)}")
            return None
        self.ctx.networks.append(name)
        return plan

    def _unrunnable(self, graph: Graph) -> dict[str, str]:
        """ONNX node -> why no device of the host runs it (one device of each kind asked)."""
        kinds = {(d.backend, d.supported_ops, d.precisions): d for d in self.ctx.devices}
        stuck = {}
        for node in graph.nodes:
            problems = [unsupported(d, node, graph) for d in kinds.values()]
            if all(problems):
                stuck[node.name] = f"ONNX {node.op_type}: {problems[0]}"
        return stuck

    def _traced_back(self, graph: Graph, stuck: dict[str, str]) -> dict[str, str] | None:
        """The ATen nodes the ONNX nodes no device runs came from -> why; None if one
        cannot be traced back (the exporter's name scopes say where each came from)."""
        names = {n.name for n in self.gm.graph.nodes}
        protos = {n.name: n for n in graph.model.graph.node}
        excluded: dict[str, str] = {}
        for onnx_name, why in stuck.items():
            source = _fx_source(protos.get(onnx_name))
            if source is None or source not in names:
                return None
            excluded[source] = f"no device runs what it becomes ({why})"
        return excluded

    def _split_around(self, excluded: dict[str, str]) -> None:
        """Split the block around `excluded` (ATen node -> why it stays in PyTorch): the
        rest form smaller blocks, each exported, checked and split again as this one.
        Tuple indexing goes where its operator goes, so an operator is excluded for its
        `getitem`; a split that would leave an excluded node in a block (no progress)
        leaves the whole block to PyTorch instead."""
        nodes = {n.name: n for n in self.gm.graph.nodes}
        for name in list(excluded):
            node = nodes[name]
            if node.target is operator.getitem and isinstance(node.args[0], Node):
                excluded.setdefault(node.args[0].name, excluded.pop(name))
        ops = sorted({op_label(nodes[name]) for name in excluded})
        why = next(iter(excluded.values()))
        if self.block.count("_") >= MAX_SPLITS:  # each split leaves out an operator: bounded
            self._fall(f"split {MAX_SPLITS} times, now around {', '.join(ops)} ({why})")
            return
        inner = split(self.gm, NodeSupport(self.ctx.options, excluded),
                      self.ctx.options.min_block_size, prefix=f"{self.block}_")
        if any(name in excluded for block in inner.blocks for name in block.nodes):
            self._fall(f"{', '.join(ops)} cannot be split off ({why})")
            return
        install(inner, self.ctx, parent=self.block)
        self.record.state = f"split around {', '.join(ops)}: {why}"
        self.inner = inner.module
        self._warn(f"split: {', '.join(ops)} stay{'s' * (len(ops) == 1)} in PyTorch ({why})")

    # -- falling back --------------------------------------------------------------------

    def _fall(self, reason: str) -> None:
        self.fallen = reason
        self.record.state = f"runs in PyTorch: {reason}"
        self.ctx.report.kept(self.record.nodes, f"block {self.block} runs in PyTorch: {reason}")
        self._warn(f"runs in PyTorch: {reason}")
        self._drop_variants()

    def _warn(self, text: str) -> None:
        warnings.warn(f"prism: block {self.ctx.graph}.{self.block} {text}", OffloadWarning,
                      stacklevel=2)

    def _drop_variants(self) -> None:
        host = self.ctx.host
        for variant in self.variants:
            if host is not None and variant.network is not None:
                remove_network(host, variant.network)
                if variant.network in self.ctx.networks:
                    self.ctx.networks.remove(variant.network)
        self.variants.clear()
        self._by_key.clear()
        self.record.variants.clear()


def remove_network(host: HostManager, name: str) -> None:
    """Unload a block's network, quietly: the host may be closing or closed already."""
    with contextlib.suppress(PrismError):
        host.remove_network(name, wait=True, timeout=5.0)


def _feeds(exported: ExportedBlock, args: Sequence[Any]) -> dict[str, np.ndarray]:
    """The call's tensors the block's model takes, by input name, as numpy views."""
    return {name: to_numpy(args[pos]) for name, pos in exported.inputs}


def _bindings(exported: ExportedBlock, args: Sequence[Any]) -> dict[str, int]:
    """Each symbolic dimension's size in this call, for the cost model."""
    out = {}
    for (_, pos), proto in zip(exported.inputs, exported.model.graph.input, strict=False):
        shape = getattr(args[pos], "shape", ())
        for d, dim in enumerate(proto.type.tensor_type.shape.dim):
            if dim.dim_param and d < len(shape):
                out[dim.dim_param] = int(shape[d])
    return out


def _fx_source(proto: onnx.NodeProto | None) -> str | None:
    """The ATen node an exported ONNX node came from (the exporter's name scope)."""
    if proto is None:
        return None
    meta = {p.key: p.value for p in proto.metadata_props}
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    try:
        names = ast.literal_eval(scopes) if scopes else []
    except (ValueError, SyntaxError):
        return None
    return names[-1] if names else None


def install(result: Split, ctx: Context, parent: str | None = None) -> list[OffloadedBlock]:
    """Put an OffloadedBlock where each block of `result` was, and record the graph's
    nodes (the first time) and blocks in the report."""
    for node, op in result.ops.items():
        ctx.report.nodes.setdefault(node, NodeRecord(node, op))
    blocks = []
    for block in result.blocks:
        offloaded = OffloadedBlock(block.name, block.module, block.nodes, ctx, parent)
        setattr(result.module, block.name, offloaded)
        for node in block.nodes:
            record = ctx.report.nodes[node]
            record.block, record.reason = block.name, None
        blocks.append(offloaded)
    for node, why in result.reasons.items():
        ctx.report.nodes[node].reason = why
    return blocks
