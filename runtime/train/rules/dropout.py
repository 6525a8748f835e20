"""Dropout: trained as in inference (PyTorch's `eval()`), whatever its training_mode input
says, so a step is deterministic: the training forward writes Identity in its place (and
an all-true mask if the model reads one), whose rule passes the gradient through."""

from __future__ import annotations

import numpy as np

from runtime.train.registry import Rewriting, rewrite


@rewrite("Dropout")
def dropout(r: Rewriting) -> dict[str, str]:
    e, node = r.e, r.node
    e.ops("Identity", [node.input[0]], [node.output[0]])
    if len(node.output) > 1 and node.output[1]:
        e.ops("Expand", [e.const(True, np.bool_), e.ints(r.shape(node.input[0]))],
              [node.output[1]])
    return {}
