"""ReduceL1: dx = sign(x) dy (0 at 0, as PyTorch's abs), dy spread back over the reduced
axes."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import reduced_axes, spread_back


@gradient("ReduceL1")
def reduce_l1(g: Grad) -> dict[int, str]:
    return {0: g.e.op("Mul", [spread_back(g, reduced_axes(g)), g.e.op("Sign", [g.x()])])}
