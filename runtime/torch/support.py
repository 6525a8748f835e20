"""Which nodes of an ATen graph may leave PyTorch, and why the others stay.

A node is offloaded when ONNX can express it (torch.onnx's library, torchlib, or the
user's `custom_translation_table` translates its operator), every tensor it reads or
makes has a numpy type on the cpu, it makes tensors, it draws nothing from PyTorch's
random generator, and neither the user (`torch_executed_ops`) nor the qualification
sweep (`refused.py`: an operator, or an operator called with some arguments) keeps it in
PyTorch. Whether some device runs the ONNX it becomes is known once a block is exported:
the block then splits around the nodes no device runs (`runtime/torch/block.py`). A size
(read from a tensor, or arithmetic on sizes) leaves with the nodes reading it when they
all leave and a block may be fed the tensor it is read from: reading a size made in a
block does not cut it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from runtime.torch.export import onnx_registry
from runtime.torch.options import OffloadOptions
from runtime.torch.refused import FIRST_OUTPUT_ONLY, REFUSED

# torch dtype -> numpy can hold it without a copy, and onnxruntime computes with it
NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8,
                          torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})


# constants lifted into the graph (an index list) must stay lifts under AOT autograd's
# fake tensors: decomposed, they alias a real tensor and tracing fails
_KEEP = (torch.ops.aten.lift, torch.ops.aten.lift_fresh)


@functools.cache
def decompositions(core: bool = False) -> dict[Any, Callable]:
    """PyTorch's decompositions of the operators ONNX has no translation for, so that the
    traced graph holds as many translatable operators as it can: the exporter's table
    (PyTorch's core ATen decompositions, then all its others), or with `core` the core
    ones alone (some of the others are not functional, which AOT autograd refuses).
    Backward operators keep their kernels: AOT autograd traces the backward graph with
    the same table, and PyTorch runs that graph (a cnn's backward took 1.6x as long
    written out)."""
    from torch.onnx._internal.exporter import _decomp

    translated = set(_decomp.get_onnx_implemented_overloads(onnx_registry()))
    if core:
        table = {op: fn for op, fn in torch.export.default_decompositions().items()
                 if op not in translated and hasattr(op, "_schema")}
    else:
        table = _decomp.create_onnx_friendly_decomposition_table(translated)
    return {op: fn for op, fn in table.items()
            if getattr(op, "overloadpacket", op) not in _KEEP and "backward" not in str(op)}


def is_size(node: Node) -> bool:
    """A symbolic size: read from a tensor (`aten.sym_size`), or arithmetic on sizes
    (`operator.mul`, `torch.sym_sum`)."""
    target = node.target
    return isinstance(node.meta.get("val"), torch.SymInt) and (
        getattr(target, "__module__", None) == "_operator"
        or getattr(target, "__name__", "").startswith("sym_"))


def op_label(node: Node) -> str:
    """The operator a node calls, as the report names it (`aten.addmm.default`)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _arguments(node: Node) -> dict[str, object]:
    """A call's arguments by name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    values = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    values.update({a.name: v for a, v in zip(schema.arguments, node.args, strict=False)})
    values.update(node.kwargs)
    return values


def _draws_nothing(node: Node) -> bool:
    """A random operator called so that it draws nothing: attention or dropout with a
    dropout probability of 0, or dropout outside training."""
    values = _arguments(node)
    return values.get("dropout_p", values.get("p")) == 0 or values.get("train") is False


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _values(arg: object) -> Iterator[object]:
    """The traced values of the graph nodes an argument holds."""
    if isinstance(arg, Node):
        yield arg.meta.get("val")
    elif isinstance(arg, list | tuple):
        for item in arg:
            yield from _values(item)
    elif isinstance(arg, Mapping):
        for item in arg.values():
            yield from _values(item)


def _tensor_problem(tensor: torch.Tensor, role: str) -> str | None:
    if tensor.dtype not in NUMPY_DTYPES:
        return f"{role} is {str(tensor.dtype).removeprefix('torch.')}, which numpy or " \
               f"onnxruntime cannot hold"
    if tensor.device.type != "cpu":
        return f"{role} lives on {tensor.device}, not the cpu"
    if tensor.layout != torch.strided:
        return f"{role} is a {tensor.layout} tensor"
    return None


class NodeSupport(OperatorSupportBase):
    """The capability check the partitioner asks; `reasons` keeps why each node stays."""

    def __init__(self, options: OffloadOptions, excluded: Mapping[str, str] | None = None):
        """`options`: the user's `torch_executed_ops` and `custom_translation_table`;
        `excluded`: node name -> why it stays, decided elsewhere (no device runs the ONNX
        it becomes)."""
        super().__init__()
        self.executed = options.torch_executed_ops
        self.translated = options.custom_translation_table
        self.excluded = dict(excluded or {})
        self.reasons: dict[str, str] = {}
        self._seen: dict[Node, str | None] = {}

    def exclude(self, excluded: Mapping[str, str]) -> None:
        """Keep these nodes in PyTorch too (node name -> why); every node is decided
        again."""
        self.excluded.update(excluded)
        self._seen.clear()
        self.reasons.clear()

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return self.problem(node) is None

    def problem(self, node: Node) -> str | None:
        """Why `node` stays in PyTorch, or None if it may be offloaded."""
        if node not in self._seen:
            why = self._problem(node)
            self._seen[node] = why
            if why is not None:
                self.reasons[node.name] = why
        return self._seen[node]

    def _problem(self, node: Node) -> str | None:
        if node.op != "call_function":
            return f"a {node.op} node"
        if node.name in self.excluded:
            return self.excluded[node.name]
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            source = node.args[0]
            return None if self.problem(source) is None else f"reads {source.name}, kept"
        if is_size(node):  # with its readers, if they leave and a block may read its tensor
            read = [v for a in node.all_input_nodes
                    if isinstance(v := a.meta.get("val"), torch.Tensor)]
            return None if node.users and all(self.problem(u) is None for u in node.users) \
                and not any(_tensor_problem(t, "") for t in read) \
                else "a size read where PyTorch runs"
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            return f"{op_label(node)} is Python arithmetic on sizes, not an ATen operator"
        label, packet = str(target), str(target.overloadpacket)
        if label in self.executed or packet in self.executed:
            return "in torch_executed_ops"
        own = target in self.translated  # the user's translation: torchlib's faults not its
        refusal = None if own else REFUSED.get(label) or REFUSED.get(packet)
        if refusal is not None and refusal.when(_arguments(node)):
            return refusal.reason
        aux = None if own else FIRST_OUTPUT_ONLY.get(label) or FIRST_OUTPUT_ONLY.get(packet)
        if aux is not None and any(u.target is operator.getitem and u.args[1] != 0
                                   for u in node.users):
            return aux
        if torch.Tag.nondeterministic_seeded in target.tags and not _draws_nothing(node):
            return "random: it draws from PyTorch's generator"
        if not own and not onnx_registry().is_registered(target):
            return "ONNX cannot express it (torch.onnx has no translation)"
        return self._values_problem(node)

    @staticmethod
    def _values_problem(node: Node) -> str | None:
        made = node.meta.get("val")
        if made is None:
            return "no traced value (shape and dtype unknown)"
        made_tensors = list(_tensors(made))
        if not made_tensors:
            return f"it makes a {type(made).__name__}, not a tensor"
        for tensor in made_tensors:
            if (why := _tensor_problem(tensor, "its output")) is not None:
                return why
        for value in _values((node.args, node.kwargs)):
            if isinstance(value, torch.Tensor):
                if (why := _tensor_problem(value, "an input")) is not None:
                    return why
            elif not isinstance(value, torch.SymInt | int):
                return f"it reads a {type(value).__name__} computed in the graph"
        return None
