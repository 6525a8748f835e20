"""The writer of training graphs: fresh names, nodes, constants, and the few shape moves
every gradient rule needs, in the opset of the graph it writes.

    e = Emitter(opset=17)
    s = e.op("Mul", [dy, y])                # one node, its output's fresh name
    g = e.unbroadcast(s, (4, 3), (1, 3))    # summed back to an operand's shape

Each node is tagged with the forward node it serves (`e.serving(name)`), which is how a
backward node finds its pipeline stage. Only ai.onnx operators are written, so every
device kind runs what comes out.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

Shape = tuple[int, ...]
# Reductions whose axes became an input at opset 18 (ReduceSum's at 13)
_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18,
                     "ReduceSumSquare": 18, "ReduceProd": 18, "ReduceL1": 18, "ReduceL2": 18}


class Emitter:
    def __init__(self, opset: int, prefix: str = "grad") -> None:
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.origins: dict[str, str] = {}  # node name -> the forward node it serves
        self._origin = ""
        self._ids = itertools.count()
        self._constants: dict[tuple[bytes, str, Shape], str] = {}

    # -- names and nodes -----------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        return f"{self.prefix}/{hint}#{next(self._ids)}"

    @contextlib.contextmanager
    def serving(self, origin: str) -> Iterator[None]:
        """Nodes written inside belong to forward node `origin` (its stage runs them)."""
        before, self._origin = self._origin, origin
        try:
            yield
        finally:
            self._origin = before

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        """One node with one output; returns the output's name."""
        return self.ops(op_type, inputs, 1, **attrs)[0]

    def ops(self, op_type: str, inputs: Sequence[str], outputs: int | Sequence[str],
            **attrs: Any) -> list[str]:
        """One node; `outputs`: how many fresh outputs, or their names."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] \
            if isinstance(outputs, int) else list(outputs)
        node = helper.make_node(op_type, list(inputs), names, name=self.fresh(op_type),
                                **{k: v for k, v in attrs.items() if v is not None})
        self.nodes.append(node)
        self.origins[node.name] = self._origin
        return names

    def add(self, node: onnx.NodeProto) -> None:
        """A node written elsewhere (a rewrite keeping the op), serving the present origin."""
        self.nodes.append(node)
        self.origins[node.name] = self._origin

    # -- constants -----------------------------------------------------------------------

    def const(self, value: Any, dtype: Any) -> str:
        """A constant initializer (shared by equal values)."""
        array = np.asarray(value, dtype=dtype)
        key = (array.tobytes(), array.dtype.str, array.shape)
        name = self._constants.get(key)
        if name is None:
            name = self.fresh("const")
            self.initializers[name] = numpy_helper.from_array(array, name)
            self._constants[key] = name
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), np.int64)

    # -- shape moves, opset-aware ----------------------------------------------------------

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool,
               out: str | None = None) -> str:
        """`op_type` over `axes` (none: `x` itself), into `out` or a fresh name."""
        if not axes:
            return x if out is None else self.ops("Identity", [x], [out])[0]
        names = [out] if out is not None else 1
        if self.opset >= _AXES_INPUT_SINCE.get(op_type, 10**6):
            return self.ops(op_type, [x, self.ints(axes)], names, keepdims=int(keepdims))[0]
        return self.ops(op_type, [x], names, axes=list(axes), keepdims=int(keepdims))[0]

    def sum(self, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        return self.reduce("ReduceSum", x, axes, keepdims)

    def mean(self, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        return self.reduce("ReduceMean", x, axes, keepdims)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", [x, self.ints(shape)])

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        if list(perm) == sorted(perm):
            return x
        return self.op("Transpose", [x], perm=list(perm))

    def expand(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Expand", [x, self.ints(shape)])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", [x, self.ints(axes)])

    def unbroadcast(self, g: str, g_shape: Shape, to: Shape) -> str:
        """`g`, a gradient of shape `g_shape`, summed over the axes numpy broadcasting
        stretched to make `g_shape` from `to`, and shaped as `to`."""
        g_shape, to = tuple(g_shape), tuple(to)
        if g_shape == to:
            return g
        lead = len(g_shape) - len(to)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(to)
                                    if d == 1 and g_shape[lead + i] != 1]
        summed = self.sum(g, axes, keepdims=True)
        return self.reshape(summed, to)


def permutation_inverse(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def broadcast_shape(*shapes: Shape) -> Shape:
    return tuple(int(d) for d in np.broadcast_shapes(*shapes))
