"""CumSum: each input element reaches the sums after it (or before, reversed), so dx is
dy's CumSum the other way, exclusive alike. The axis must not depend on the data."""

from runtime.train.registry import Grad, gradient


@gradient("CumSum")
def cum_sum(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    g.static(1, "axis")
    return {0: g.e.op("CumSum", [dy, g.x(1)], exclusive=g.attr("exclusive", 0),
                      reverse=1 - g.attr("reverse", 0))}
