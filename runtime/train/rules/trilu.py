"""Trilu: the output's gradient through the same triangle (k and upper as given)."""

from runtime.train.registry import Grad, gradient


@gradient("Trilu")
def trilu(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Trilu", [dy, *g.node.input[1:2]], upper=g.attr("upper", 1))}
