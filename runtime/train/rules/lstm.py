"""LSTM, unrolled over its sequence into ai.onnx ops whose rules give its gradient (the
sequence length is the batch's, as every shape in a training graph is). Per direction,
gates i, o, f, c (onnx's order) from X W^T + H R^T + Wb + Rb; C = f C + i tanh(c~),
H = o tanh(C); X W^T is one MatMul over every step. Forward, reverse and bidirectional,
both layouts, initial states and every output. What PyTorch never exports is refused:
other activations, clip, input_forget, peepholes, sequence_lens.
"""

from __future__ import annotations

from runtime.errors import TrainingError
from runtime.train.registry import Rewriting, rewrite

_DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


@rewrite("LSTM")
def lstm(r: Rewriting) -> dict[str, str]:
    e, node = r.e, r.node
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    x, w, rec, bias, lens, h0, c0, peep = inputs
    _refuse_unusual(r, lens, peep)
    layout = r.attr("layout", 0)
    if layout:  # batch first: [seq, batch, input] and [directions, batch, H] here
        x, h0, c0 = (t and e.transpose(t, [1, 0, 2]) for t in (x, h0, c0))
    steps, batch = r.shape(node.input[0])[1::-1] if layout else r.shape(x)[:2]
    hidden = r.attr("hidden_size") or r.shape(w)[1] // 4
    directions = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[
        r.attr("direction", "forward")]
    ys, hs, cs = [], [], []
    for d, backwards in enumerate(directions):
        def at(t: str, d: int = d) -> str:
            return e.op("Gather", [t, e.ints([d])], axis=0)  # [1, ...]: direction d
        gates_x = e.op("MatMul", [x, e.transpose(e.reshape(at(w), [4 * hidden, -1]),
                                                         [1, 0])])  # [seq, batch, 4H]
        if bias:
            halves = e.reshape(at(bias), [2, 4 * hidden])
            gates_x = e.op("Add", [gates_x, e.sum(halves, [0], keepdims=False)])
        r_t = e.transpose(e.reshape(at(rec), [4 * hidden, hidden]), [1, 0])
        h = e.reshape(at(h0), [batch, hidden]) if h0 else _zeros(r, node.input[0], batch, hidden)
        c = e.reshape(at(c0), [batch, hidden]) if c0 else _zeros(r, node.input[0], batch, hidden)
        outs: list[str] = []
        for t in (reversed(range(steps)) if backwards else range(steps)):
            step = e.reshape(e.op("Slice", [gates_x, e.ints([t]), e.ints([t + 1]),
                                            e.ints([0])]), [batch, 4 * hidden])
            gates = e.op("Add", [step, e.op("MatMul", [h, r_t])])
            i, o, f, cand = e.ops("Split", [gates, e.ints([hidden] * 4)], 4, axis=1)
            c = e.op("Add", [e.op("Mul", [e.op("Sigmoid", [f]), c]),
                             e.op("Mul", [e.op("Sigmoid", [i]), e.op("Tanh", [cand])])])
            h = e.op("Mul", [e.op("Sigmoid", [o]), e.op("Tanh", [c])])
            outs.append(e.unsqueeze(h, [0]))
        ys.append(e.unsqueeze(e.op("Concat", outs[::-1] if backwards else outs, axis=0), [1]))
        hs.append(e.unsqueeze(h, [0]))
        cs.append(e.unsqueeze(c, [0]))
    y = ys[0] if len(ys) == 1 else e.op("Concat", ys, axis=1)  # [seq, directions, batch, H]
    y_h, y_c = (s[0] if len(s) == 1 else e.op("Concat", s, axis=0) for s in (hs, cs))
    if layout:  # batch first
        y, y_h, y_c = e.transpose(y, [2, 0, 1, 3]), e.transpose(y_h, [1, 0, 2]), \
            e.transpose(y_c, [1, 0, 2])
    for name, value in zip(node.output, (y, y_h, y_c), strict=False):
        if name:
            e.ops("Identity", [value], [name])
    return {}


def _refuse_unusual(r: Rewriting, lens: str, peep: str) -> None:
    found = [what for what, there in (
        ("activations", tuple(a.decode() if isinstance(a, bytes) else a for a in (
            r.attr("activations") or [])) not in ((), _DEFAULT_ACTIVATIONS,
                                                  _DEFAULT_ACTIVATIONS * 2)),
        ("clip", r.attr("clip") is not None), ("input_forget", bool(r.attr("input_forget", 0))),
        ("sequence_lens", bool(lens)), ("peepholes", bool(peep))) if there]
    if found:
        raise TrainingError(f"node {r.node.name} (LSTM): training supports no "
                            f"{', '.join(found)}")


def _zeros(r: Rewriting, like: str, batch: int, hidden: int) -> str:
    return r.e.expand(r.const(0, like), [batch, hidden])
