"""What RNN, GRU and LSTM share as trained: the node unrolled over its sequence (the
batch's length, as every shape in a training graph is) into ai.onnx ops whose rules give
its gradient. Per direction, X W^T + Wb is one MatMul over every step; a cell turns each
step's share of it and the states before into the states after; the first state at every
step makes Y, the last step's states Y_h (and Y_c). Forward, reverse and bidirectional,
both layouts, initial states and every output. What PyTorch never exports is refused:
other activations, clip, sequence_lens, and what `refused` adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.errors import TrainingError
from runtime.train.emit import Emitter
from runtime.train.registry import Rewriting


@dataclass(frozen=True)
class Direction:
    """One direction's weights, as a cell reads them."""

    e: Emitter
    hidden: int
    r_t: str  # R^T: [H, gates * H]
    rb: str | None  # Rb: [gates * H]

    def recurrent(self, h: str) -> str:
        """H R^T + Rb."""
        out = self.e.op("MatMul", [h, self.r_t])
        return out if self.rb is None else self.e.op("Add", [out, self.rb])

    def split(self, x: str, parts: int) -> list[str]:
        return self.e.ops("Split", [x, self.e.ints([self.hidden] * parts)], parts, axis=1)


# (step's X W^T + Wb [batch, gates * H], states before, direction) -> states after
Cell = Callable[[str, Sequence[str], Direction], list[str]]


def unrolled(r: Rewriting, gates: int, states: int, activations: Sequence[str], cell: Cell,
             refused: Sequence[tuple[str, bool]] = ()) -> None:
    """Write node `r` (inputs X, W, R, B, sequence_lens, then `states` initial states) as
    `cell` unrolled; `gates` blocks of H in W, R and each half of B; `activations` its
    default ones (for one direction)."""
    e, node = r.e, r.node
    given: list[str] = [*node.input, *[""] * (5 + states - len(node.input))]
    x, w, rec, bias, lens = given[:5]
    initial = given[5:5 + states]
    named = tuple(a.decode() if isinstance(a, bytes) else a for a in r.attr("activations") or [])
    found = [what for what, there in (
        ("activations", named not in ((), tuple(activations), tuple(activations) * 2)),
        ("clip", r.attr("clip") is not None), ("sequence_lens", bool(lens)), *refused)
        if there]
    if found:
        raise TrainingError(f"node {node.name} ({node.op_type}): training supports no "
                            f"{', '.join(found)}")
    layout = r.attr("layout", 0)
    steps, batch = r.shape(x)[1::-1] if layout else r.shape(x)[:2]
    hidden = r.attr("hidden_size") or r.shape(rec)[-1]
    if layout:  # batch first: [seq, batch, input] and [directions, batch, H] here
        x, *initial = (t and e.transpose(t, [1, 0, 2]) for t in (x, *initial))
    backwards = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[
        r.attr("direction", "forward")]
    ys, finals = [], []
    for d, reverse in enumerate(backwards):
        def at(t: str, shape: list[int], d: int = d) -> str:  # direction d's part of t
            return e.reshape(e.op("Gather", [t, e.ints([d])], axis=0), shape)
        width = gates * hidden
        x_w = e.op("MatMul", [x, e.transpose(at(w, [width, -1]), [1, 0])])  # [seq, batch, G*H]
        rb = None
        if bias:
            wb, rb = e.ops("Split", [at(bias, [2 * width]), e.ints([width, width])], 2, axis=0)
            x_w = e.op("Add", [x_w, wb])
        way = Direction(e, hidden, e.transpose(at(rec, [width, hidden]), [1, 0]), rb)
        now = [at(s, [batch, hidden]) if s else e.expand(r.const(0, node.input[0]), [
            batch, hidden]) for s in initial]
        outs = []
        for t in reversed(range(steps)) if reverse else range(steps):
            step = e.reshape(e.op("Slice", [x_w, e.ints([t]), e.ints([t + 1]), e.ints([0])]),
                             [batch, width])
            now = cell(step, now, way)
            outs.append(e.unsqueeze(now[0], [0]))
        ys.append(e.unsqueeze(e.op("Concat", outs[::-1] if reverse else outs, axis=0), [1]))
        finals.append([e.unsqueeze(s, [0]) for s in now])
    y = ys[0] if len(ys) == 1 else e.op("Concat", ys, axis=1)  # [seq, directions, batch, H]
    ends = [parts[0] if len(parts) == 1 else e.op("Concat", list(parts), axis=0)
            for parts in zip(*finals, strict=True)]  # each [directions, batch, H]
    if layout:
        y, ends = e.transpose(y, [2, 0, 1, 3]), [e.transpose(s, [1, 0, 2]) for s in ends]
    for name, value in zip(node.output, [y, *ends], strict=False):
        if name:
            e.ops("Identity", [value], [name])
