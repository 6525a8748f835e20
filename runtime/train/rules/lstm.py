"""LSTM, unrolled (`_recurrent.py`): gates i, o, f, c (onnx's order) from
X W^T + Wb + H R^T + Rb; C = f C + i tanh(c~), H = o tanh(C). No peepholes, no
input_forget (PyTorch exports neither)."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.train.registry import Rewriting, rewrite
from runtime.train.rules._recurrent import Direction, unrolled


@rewrite("LSTM")
def lstm(r: Rewriting) -> dict[str, str]:
    peepholes = len(r.node.input) > 7 and bool(r.node.input[7])
    unrolled(r, 4, 2, ("Sigmoid", "Tanh", "Tanh"), _cell, [
        ("input_forget", bool(r.attr("input_forget", 0))), ("peepholes", peepholes)])
    return {}


def _cell(step: str, states: Sequence[str], way: Direction) -> list[str]:
    e, (h, c) = way.e, states
    i, o, f, cand = way.split(e.op("Add", [step, way.recurrent(h)]), 4)
    c = e.op("Add", [e.op("Mul", [e.op("Sigmoid", [f]), c]),
                     e.op("Mul", [e.op("Sigmoid", [i]), e.op("Tanh", [cand])])])
    return [e.op("Mul", [e.op("Sigmoid", [o]), e.op("Tanh", [c])]), c]
