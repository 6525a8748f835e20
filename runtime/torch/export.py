"""One block of an ATen graph -> an ONNX model, with the call's real tensors.

The block's weights (parameters and buffers) become the model's initializers, so the
partitioner sees and places them; its other tensors become the model's inputs. Sizes the
block reads as Python ints are computed from its tensors' shapes where the size is
arithmetic over sizes their dimensions are (`s0`, `s0 + 1` for a cache one token longer),
so a block of a dynamic graph exports with dynamic dimensions; a size they do not carry is
fixed at its value, and the model then serves that value only.

The exporter is `torch.onnx.export(..., dynamo=True)`'s own (`_core.export`, given a registry
built once rather than at every call): torch.export of the block, then torchlib's
translation of each ATen operator and onnxscript's optimizer (constant folding, BatchNorm
into Conv). The block is already ATen, decomposed with the exporter's own table, so the
export re-traces what it will translate, but does not decompose it again
(`_decomposed_already`).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx
import sympy  # type: ignore[import-untyped]
import torch
from torch._dynamo.convert_frame import compile_lock
from torch.fx import GraphModule
from torch.onnx._constants import ONNX_DEFAULT_OPSET
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.reference import PythonReferenceAnalysis

if TYPE_CHECKING:  # onnxscript loads with it: at the first export, not at import
    from torch.onnx._internal.exporter._registration import ONNXRegistry


@dataclass(frozen=True)
class Source:
    """What a block's placeholder becomes in the exported model: a fed tensor (`fed`, its
    index among them), a weight (`weight`, its buffer), a size computed from fed tensors'
    dimensions (`size`: the expression `size`, each symbol read from (fed index, dim) in
    `reads`), or an int fixed at export (`fixed`, its `value`)."""

    kind: str
    index: int = 0
    buffer: str = ""
    size: sympy.Expr | None = None
    reads: tuple[tuple[sympy.Symbol, int, int], ...] = ()
    value: int = 0


@dataclass(frozen=True)
class ExportedBlock:
    """An exported block: the model, which call arguments feed which inputs, the fixed
    dimensions each input must have (None where dynamic), the ints it was fixed at."""

    model: onnx.ModelProto
    inputs: tuple[tuple[str, int], ...]       # (model input, position in the call)
    dims: tuple[tuple[int | None, ...], ...]  # per model input
    outputs: tuple[str, ...]
    constants: frozenset[str]                 # outputs the model holds as constants
    fixed: tuple[tuple[int, int], ...]        # (position, value) of ints fixed at export
    seconds: float = 0.0


# dynamo's own: an export traces with the same process-wide state (fake tensors, the
# tracing context) a graph dynamo compiles in another thread is traced with
_EXPORTING = compile_lock


@contextmanager
def _exporting_here() -> Iterator[None]:
    """`torch.compiler.is_exporting()` true in this thread alone while it exports. torch.export
    sets a flag of the process's, and a compiled call in another thread that reads it
    annotates in a dict of the process's (`torch.fx.traceback.current_meta`): two at once
    fail (KeyError 'custom')."""
    exporter, plain = threading.get_ident(), torch.compiler.is_exporting
    torch.compiler.is_exporting = lambda: plain() and threading.get_ident() == exporter
    try:
        yield
    finally:
        torch.compiler.is_exporting = plain


@functools.lru_cache(maxsize=4)
def _decomposed_ops(registry: ONNXRegistry) -> frozenset[Any]:
    """The operators the exporter decomposes before it translates, given `registry`: those
    with a decomposition of PyTorch's and no ONNX translation."""
    from torch.onnx._internal.exporter import _decomp

    return frozenset(_decomp.create_onnx_friendly_decomposition_table(
        set(_decomp.get_onnx_implemented_overloads(registry))))


def _as_traced(program: torch.export.ExportedProgram, decomposed: frozenset[Any]) -> bool:
    """Whether every call of `program` is a functional ATen operator the exporter would
    not decompose, or arithmetic on sizes: then decomposing it again changes nothing."""
    for node in program.graph_module.graph.nodes:
        target, module = node.target, getattr(node.target, "__module__", None)
        if node.op != "call_function" or module in ("_operator", "math") or (
                module == "torch" and getattr(target, "__name__", "").startswith("sym_")):
            continue
        if not isinstance(target, torch._ops.OpOverload) or target in decomposed or \
                target._schema.is_mutable:
            return False
    return True


@contextmanager
def _decomposed_already() -> Iterator[None]:
    """The exporter decomposes the program it traced (`run_decompositions`, a trace of its
    own: 0.6 s of a BERT block's 2.1 s export); a block is ATen already, decomposed with
    the exporter's table. In this thread, a program as the exporter would leave it
    (`_as_traced`) goes on as traced; any other is decomposed as the exporter does."""
    from torch.onnx._internal.exporter import _fx_passes

    exporter, decompose = threading.get_ident(), _fx_passes.decompose_with_registry

    def once(exported_program: torch.export.ExportedProgram, registry: ONNXRegistry
             ) -> torch.export.ExportedProgram:
        if threading.get_ident() == exporter and \
                _as_traced(exported_program, _decomposed_ops(registry)):
            return exported_program
        return decompose(exported_program, registry)

    _fx_passes.decompose_with_registry = once
    try:
        yield
    finally:
        _fx_passes.decompose_with_registry = decompose


class ExportFailed(Exception):
    """The exporter refused the block; `op` names the operator it failed at, if it said."""

    def __init__(self, op: str | None, cause: str):
        super().__init__(f"{op or 'the block'}: {cause}")
        self.op, self.cause = op, cause


class _SizeArithmetic(PythonReferenceAnalysis):
    """torch's Python reference for arithmetic on sizes, with the operations it leaves to its
    sympy parent: those build sympy expressions of the traced sizes, which no ATen operator
    takes (torchvision pads an image to `int(ceil(h / 32.0) * 32.0)`, a `TruncToInt`)."""

    @staticmethod
    def trunc_to_int(x: Any, dtype: torch.dtype) -> Any:
        return torch.sym_int(x)

    @staticmethod
    def int_truediv(a: Any, b: Any) -> Any:
        return a / b


class _Block(torch.nn.Module):
    """The block as the exporter sees it: fed tensors in, weights as buffers, sizes read
    from the fed tensors' shapes."""

    def __init__(self, gm: GraphModule, sources: Sequence[Source],
                 weights: dict[str, torch.Tensor]):
        super().__init__()
        self.gm, self.sources = gm, list(sources)
        for name, value in weights.items():
            self.register_buffer(name, value.detach())

    def forward(self, *fed: torch.Tensor) -> object:
        args: list[object] = []
        for source in self.sources:
            if source.kind == "fed":
                args.append(fed[source.index])
            elif source.kind == "weight":
                args.append(getattr(self, source.buffer))
            elif source.kind == "size":
                symbols = {sym: fed[k].size(d) for sym, k, d in source.reads}
                args.append(sympy_interp(_SizeArithmetic, symbols, source.size))
            else:
                args.append(source.value)
        return self.gm(*args)


@contextmanager
def quiet_loggers(names: Sequence[str] = ("torch.onnx", "torch.export", "onnxscript",
                                          "onnx_ir")) -> Iterator[None]:
    """The exporter's loggers silenced: they log what they skip, rewrite and fail at, and
    a failure reaches the caller as an ExportFailed."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _sources(gm: GraphModule, args: Sequence[object], weights: frozenset[int]
             ) -> tuple[list[Source], list[int], dict[str, torch.Tensor], dict[int, int]]:
    """Per placeholder what feeds it, the positions of the fed tensors, the weights by
    buffer name, the ints fixed (position -> value)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fed_positions = [i for i, a in enumerate(args)
                     if isinstance(a, torch.Tensor) and i not in weights]
    fed_index = {pos: k for k, pos in enumerate(fed_positions)}
    carried = _carried_sizes(placeholders, fed_positions)
    sources: list[Source] = []
    buffers: dict[str, torch.Tensor] = {}
    fixed: dict[int, int] = {}
    for i, (node, arg) in enumerate(zip(placeholders, args, strict=True)):
        if i in fed_index:
            sources.append(Source("fed", index=fed_index[i]))
        elif isinstance(arg, torch.Tensor):
            name = f"w{len(buffers)}_{node.name}"
            buffers[name] = arg
            sources.append(Source("weight", buffer=name))
        else:
            size = _size_source(node.meta.get("val"), carried)
            if size is None:
                fixed[i] = int(arg)  # type: ignore[call-overload]
                size = Source("fixed", value=fixed[i])
            sources.append(size)
    return sources, fed_positions, buffers, fixed


def _carried_sizes(placeholders: list, fed_positions: list[int]
                   ) -> dict[sympy.Expr, tuple[sympy.Symbol, int, int]]:
    """Each symbolic size a fed tensor's dimension is (`s0`, `s0 + 1`) -> a symbol naming
    it, and (fed index, dim) of the first such dimension."""
    carried: dict[sympy.Expr, tuple[sympy.Symbol, int, int]] = {}
    for k, pos in enumerate(fed_positions):
        fake = placeholders[pos].meta.get("val")
        for d, size in enumerate(getattr(fake, "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr not in carried:
                carried[size.node.expr] = (sympy.Symbol(f"fed{k}_dim{d}"), k, d)
    return carried


def _size_source(value: object, carried: dict[sympy.Expr, tuple[sympy.Symbol, int, int]]
                 ) -> Source | None:
    """A size computed from fed tensors' dimensions, if the symbolic int `value` is
    arithmetic over sizes they carry (whole ones first: `s0 + 1` is a dimension itself)."""
    if not isinstance(value, torch.SymInt):
        return None
    expr = value.node.expr.xreplace({size: read[0] for size, read in carried.items()})
    reads = tuple(read for read in carried.values() if read[0] in expr.free_symbols)
    if len(reads) != len(expr.free_symbols):  # a symbol no fed dimension carries
        return None
    return Source("size", size=expr, reads=reads)


def _dynamic_dims(gm: GraphModule, fed_positions: list[int]) -> tuple | None:
    """Dim.AUTO on every dimension the traced graph left symbolic, or None if none is."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = []
    for pos in fed_positions:
        fake = placeholders[pos].meta.get("val")
        specs.append({d: torch.export.Dim.AUTO for d, s in enumerate(fake.shape)
                      if isinstance(s, torch.SymInt)} or None)
    return (tuple(specs),) if any(specs) else None  # forward(*fed): one positional


_OVERLOAD = re.compile(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)")
_TARGET = re.compile(r"target=torch\.ops\.(\w+\.\w+\.\w+)")
_ATEN = re.compile(r"\b(aten(?:::|\.)\w+(?:\.\w+)?)")


def failed_op(text: str) -> str | None:
    """The operator an exporter message names first (`aten.foo.default`), if any."""
    if match := _OVERLOAD.search(text):
        return f"{match.group(1)}.{match.group(2)}"
    if match := _TARGET.search(text):
        return match.group(1)
    if match := _ATEN.search(text):
        return match.group(1).replace("::", ".")
    return None


def _cause(exc: BaseException) -> str:
    """The innermost reason, on one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)[:200]


def _torchlib() -> ONNXRegistry:
    """torch.onnx's registry of ATen -> ONNX translations, as `torch.onnx.export` builds it
    anew for each call (half a second to a second an export, paid by each block)."""
    from torch.onnx._internal.exporter import _registration

    with quiet_loggers():  # it warns of each torchvision op it skips
        return _registration.ONNXRegistry.from_torchlib(opset_version=ONNX_DEFAULT_OPSET)


@functools.cache
def onnx_registry() -> ONNXRegistry:
    """The registry, built once: the exports and `support` only read it."""
    return _torchlib()


def _registry(translations: Mapping[Any, Any] | None) -> ONNXRegistry:
    """The kept registry, or with the user's `custom_translation_table` a new one holding
    them too, registered as `torch.onnx.export` registers them."""
    if not translations:
        return onnx_registry()
    registry = _torchlib()
    for op, translation in translations.items():
        registry.register_op(op, translation, is_complex=False)
    return registry


def export_block(gm: GraphModule, args: Sequence[object], weights: frozenset[int],
                 translations: Mapping[Any, Any] | None = None) -> ExportedBlock:
    """Export `gm` called with `args`; `weights`: positions of args to hold as
    initializers; `translations`: the user's `custom_translation_table`. Raises
    ExportFailed naming the operator the exporter stopped at."""
    sources, fed_positions, buffers, fixed = _sources(gm, args, weights)
    dynamic = None if fixed else _dynamic_dims(gm, fed_positions)
    wrapper = _Block(gm, sources, buffers).eval()
    fed = tuple(args[i] for i in fed_positions)
    from torch.onnx._internal.exporter import _core

    start = time.perf_counter()
    try:
        # one export at a time, never beside a compile of dynamo's (torch.export's tracing
        # state and the loggers' levels are the process's), seen as an export in this
        # thread alone, outside any dispatch mode the caller runs under (AOT autograd
        # checks a graph's first call for aliasing custom ops with one)
        with _EXPORTING, _exporting_here(), _decomposed_already(), _disable_current_modes(), \
                torch.no_grad(), warnings.catch_warnings(), quiet_loggers():
            warnings.simplefilter("ignore")
            program = _core.export(wrapper, fed, registry=_registry(translations),
                                   dynamic_shapes=dynamic, verbose=False, optimize=True,
                                   opset_version=ONNX_DEFAULT_OPSET)
    except Exception as exc:  # the exporter raises many kinds; each becomes a fallback
        text = "\n".join(str(e) for e in _chain(exc))
        raise ExportFailed(failed_op(text), _cause(exc)) from None
    seconds = time.perf_counter() - start
    if program is None:
        raise ExportFailed(None, "the exporter returned no model")
    model = program.model_proto
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    if len(names) != len(fed_positions):
        raise ExportFailed(None, f"the model takes {len(names)} inputs for "
                                 f"{len(fed_positions)} tensors")
    dims = tuple(tuple(d.dim_value if d.HasField("dim_value") else None
                       for d in i.type.tensor_type.shape.dim)
                 for i in model.graph.input if i.name not in initializers)
    made_by_constant = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    outputs = tuple(o.name for o in model.graph.output)
    return ExportedBlock(model, tuple(zip(names, fed_positions, strict=True)), dims, outputs,
                         frozenset(o for o in outputs
                                   if o in initializers or o in made_by_constant),
                         tuple(sorted(fixed.items())), seconds)


def _chain(exc: BaseException) -> list[BaseException]:
    out = [exc]
    while (cause := out[-1].__cause__) is not None and len(out) < 10:
        out.append(cause)
    return out
