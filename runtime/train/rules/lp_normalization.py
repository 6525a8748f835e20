"""LpNormalization: x over its L1 or L2 norm along one axis, rewritten as that reduction
and a Div, whose rules give its gradient."""

from runtime.train.registry import Rewriting, rewrite


@rewrite("LpNormalization")
def lp_normalization(r: Rewriting) -> dict[str, str]:
    x, e = r.node.input[0], r.e
    axis = r.attr("axis", -1) % len(r.shape(x))
    norm = e.reduce("ReduceL2" if r.attr("p", 2) == 2 else "ReduceL1", x, [axis], keepdims=True)
    e.ops("Div", [x, norm], [r.node.output[0]])
    return {}
