"""SoftmaxCrossEntropyLoss(scores, labels[, weights]): for each labelled position i
(labels equal to ignore_index count for nothing), with p = softmax(scores) over the class
axis 1 and w_i the weight of its label (1 without weights),

    d scores[i] = coef_i * (p[i] - onehot(label_i))
    coef_i = dloss_i * w_i             reduction none (dloss per position)
           = dloss * w_i               sum
           = dloss * w_i / sum_j w_j   mean (PyTorch's F.cross_entropy)

plus, when the log_prob output is read, that output's LogSoftmax gradient. Weights given
as a float initializer get theirs: coef-weighted (nll_i - loss) for the mean.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from runtime.train.registry import Grad, gradient


@gradient("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(g: Grad) -> dict[int, str]:
    e, scores, labels = g.e, g.x(0), g.x(1)
    shape = g.shape(scores)
    reduction = g.attr("reduction", "mean")
    rest = list(range(2, len(shape)))
    labels64 = e.op("Cast", [labels], to=TensorProto.INT64)
    classes = np.arange(shape[1], dtype=np.int64).reshape(1, shape[1], *[1] * len(rest))
    hit = e.op("Equal", [e.unsqueeze(labels64, [1]), e.const(classes, np.int64)])
    onehot = e.op("Cast", [hit], to=helper.np_dtype_to_tensor_dtype(g.facts.dtype(scores)))
    prob = e.op("Softmax", [scores], axis=1)
    per = _position_weights(g, labels64)  # w_i * kept_i per position, or None: all 1
    dloss = g.dy(0)
    grads: dict[int, str] = {}
    total: str | None = None
    if dloss is not None:
        coef = dloss if per is None else e.op("Mul", [dloss, per])
        if reduction == "mean":
            every = list(range(len(g.shape(labels))))
            denom = g.const(math.prod(g.shape(labels)), scores) if per is None else \
                _total(g, per, every)
            coef = e.op("Div", [coef, denom])
        if per is not None or reduction == "none":  # one per position: onto the class axis
            coef = e.unsqueeze(coef, [1])
        total = e.op("Mul", [e.op("Sub", [prob, onehot]), coef])
    dlogp = g.dy(1)
    if dlogp is not None:
        spread = e.op("Mul", [prob, e.sum(dlogp, [1], keepdims=True)])
        part = e.op("Sub", [dlogp, spread])
        total = part if total is None else e.op("Add", [total, part])
    if total is not None and g.needs(0):
        grads[0] = total
    if g.has(2) and g.needs(2) and dloss is not None:
        grads[2] = _weights_gradient(g, onehot, labels64, reduction, dloss, per)
    return grads


def _total(g: Grad, per: str, axes: list[int]) -> str:
    """The positions' weights summed, at least the least normal float: where every label
    is ignored (a micro-batch of padding), each position's share is 0, not 0 / 0."""
    total = g.e.reduce("ReduceSum", per, axes, keepdims=False)
    return g.e.op("Max", [total, g.const(np.finfo(g.facts.dtype(g.x(0))).tiny, g.x(0))])


def _kept(g: Grad, labels64: str) -> str | None:
    """1 where the label is not ignore_index, else 0 (None without ignore_index)."""
    ignore = g.attrs.get("ignore_index")
    if ignore is None:
        return None
    e = g.e
    same = e.op("Equal", [labels64, e.ints([int(ignore)])])
    return e.op("Where", [same, g.const(0, g.x(0)), g.const(1, g.x(0))])


def _position_weights(g: Grad, labels64: str) -> str | None:
    e = g.e
    kept = _kept(g, labels64)
    if not g.has(2):
        return kept
    safe = labels64 if kept is None else e.op(
        "Where", [e.op("Greater", [kept, g.const(0, g.x(0))]), labels64, e.ints([0])])
    weight = e.op("Gather", [g.x(2), safe])
    return weight if kept is None else e.op("Mul", [weight, kept])


def _weights_gradient(g: Grad, onehot: str, labels64: str, reduction: str, dloss: str,
                      per: str | None) -> str:
    """d loss / d weights[c]: the positions labelled c, each its nll (minus the loss, over
    the weights' total, for the mean) times the output's gradient."""
    e = g.e
    rank = len(g.shape(g.x(1)))
    logp = e.op("LogSoftmax", [g.x(0)], axis=1)
    nll = e.op("Neg", [e.sum(e.op("Mul", [onehot, logp]), [1], keepdims=False)])
    kept = _kept(g, labels64)
    if reduction == "mean":
        assert per is not None
        spread = e.op("Div", [e.op("Sub", [nll, g.y(0)]), _total(g, per, list(range(rank)))])
    else:
        spread = nll
    if kept is not None:
        spread = e.op("Mul", [spread, kept])
    spread = e.op("Mul", [spread, dloss])
    by_class = e.op("Mul", [onehot, e.unsqueeze(spread, [1])])
    axes = [0, *range(2, rank + 1)]
    return e.sum(by_class, axes, keepdims=False)
