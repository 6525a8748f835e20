"""RNN, unrolled (`_recurrent.py`): H = tanh(X W^T + Wb + H R^T + Rb)."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.train.registry import Rewriting, rewrite
from runtime.train.rules._recurrent import Direction, unrolled


@rewrite("RNN")
def rnn(r: Rewriting) -> dict[str, str]:
    unrolled(r, 1, 1, ("Tanh",), _cell)
    return {}


def _cell(step: str, states: Sequence[str], way: Direction) -> list[str]:
    return [way.e.op("Tanh", [way.e.op("Add", [step, way.recurrent(states[0])])])]
