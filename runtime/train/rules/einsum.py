"""Einsum: an operand's gradient is the Einsum of dY with the other operands, onto the
operand's own subscripts; a subscript only that operand has (summed away in it alone) is
expanded back. Implicit output (the subscripts seen once, sorted) too; an ellipsis or a
subscript repeated within one operand (a diagonal) is refused."""

from __future__ import annotations

from runtime.errors import TrainingError
from runtime.train.registry import Grad, gradient


@gradient("Einsum")
def einsum(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    equation = g.attr("equation").replace(" ", "")
    given, arrow, out = equation.partition("->")
    terms = given.split(",")
    if not arrow:
        out = "".join(sorted(c for c in set(given) - {","} if given.count(c) == 1))
    if "." in equation or any(len(set(t)) != len(t) for t in terms):
        raise TrainingError(f"node {g.node.name} (Einsum): training takes no ellipsis and "
                            f"no subscript repeated in one operand, got {equation!r}")
    grads = {}
    for i, term in enumerate(terms):
        if not g.needs(i):
            continue
        others = [t for j, t in enumerate(terms) if j != i]
        seen = set(out).union(*others)
        got = "".join(c for c in term if c in seen)
        grad = e.op("Einsum", [dy, *(g.x(j) for j in range(len(terms)) if j != i)],
                    equation=f"{','.join([out, *others])}->{got}")
        if got != term:
            grad = e.expand(e.unsqueeze(grad, [k for k, c in enumerate(term) if c not in seen]),
                            g.shape(g.x(i)))
        grads[i] = grad
    return grads
