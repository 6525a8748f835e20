"""Log: dx = dy / x."""

from runtime.train.registry import Grad, gradient


@gradient("Log")
def log(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Div", [dy, g.x()])}
