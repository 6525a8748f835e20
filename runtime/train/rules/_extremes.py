"""Max and Min of any number of operands: the output's gradient goes to the operands equal
to the result, split evenly among ties (as PyTorch's maximum and minimum), each
unbroadcast."""

from __future__ import annotations

from onnx import helper

from runtime.train.registry import Grad


def to_extremes(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    out = g.shape(y)
    elem = helper.np_dtype_to_tensor_dtype(g.facts.dtype(y))
    hits = [e.op("Cast", [e.op("Equal", [x, y])], to=elem) for x in g.node.input]
    count = hits[0] if len(hits) == 1 else e.op("Sum", hits)
    share = e.op("Div", [dy, count])
    return {i: e.unbroadcast(e.op("Mul", [share, hit]), out, g.shape(g.x(i)))
            for i, hit in enumerate(hits) if g.needs(i)}
