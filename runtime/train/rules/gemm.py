"""Gemm: y = alpha op(A) op(B) + beta C, op a transpose when transA/transB say. Each
gradient is itself one Gemm (the four transpose cases written out), C's the output's
times beta, unbroadcast."""

from __future__ import annotations

from runtime.train.registry import Grad, gradient


@gradient("Gemm")
def gemm(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    a, b = g.x(0), g.x(1)
    alpha, beta = float(g.attr("alpha", 1.0)), float(g.attr("beta", 1.0))
    ta, tb = int(g.attr("transA", 0)), int(g.attr("transB", 0))
    grads = {}
    if g.needs(0):  # dA' = alpha dY B'^T, and dA = dA'^T when transA
        grads[0] = e.op("Gemm", [dy, b], alpha=alpha, transB=1 - tb) if not ta else \
            e.op("Gemm", [b, dy], alpha=alpha, transA=tb, transB=1)
    if g.needs(1):  # dB' = alpha A'^T dY, and dB = dB'^T when transB
        grads[1] = e.op("Gemm", [a, dy], alpha=alpha, transA=1 - ta) if not tb else \
            e.op("Gemm", [dy, a], alpha=alpha, transA=1, transB=ta)
    if g.has(2) and g.needs(2):
        scaled = dy if beta == 1.0 else e.op("Mul", [dy, g.const(beta, g.y())])
        grads[2] = e.unbroadcast(scaled, g.shape(g.y()), g.shape(g.x(2)))
    return grads
