"""GRU, unrolled (`_recurrent.py`): gates z, r, h (onnx's order); z and r from
X W^T + Wb + H R^T + Rb, the candidate tanh(X Wh^T + Wbh + r (H Rh^T + Rbh)) with
linear_before_reset (as PyTorch exports it), else tanh(X Wh^T + Wbh + (r H) Rh^T + Rbh);
H = (1 - z) h~ + z H."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.train.registry import Rewriting, rewrite
from runtime.train.rules._recurrent import Direction, unrolled


@rewrite("GRU")
def gru(r: Rewriting) -> dict[str, str]:
    before = bool(r.attr("linear_before_reset", 0))

    def cell(step: str, states: Sequence[str], way: Direction) -> list[str]:
        e, (h,) = way.e, states
        xz, xr, xh = way.split(step, 3)
        hz, hr, hh = way.split(way.recurrent(h), 3)
        z = e.op("Sigmoid", [e.op("Add", [xz, hz])])
        reset = e.op("Sigmoid", [e.op("Add", [xr, hr])])
        if not before:
            hh = way.split(way.recurrent(e.op("Mul", [reset, h])), 3)[2]
        cand = e.op("Tanh", [e.op("Add", [xh, e.op("Mul", [reset, hh]) if before else hh])])
        one = r.const(1, r.node.input[0])
        return [e.op("Add", [e.op("Mul", [e.op("Sub", [one, z]), cand]), e.op("Mul", [z, h])])]

    unrolled(r, 3, 1, ("Sigmoid", "Tanh"), cell)
    return {}
