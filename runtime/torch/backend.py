"""The dynamo backend `prism`: `torch.compile(module, backend="prism", options={...})`.

Dynamo captures a graph; AOT autograd lowers it to ATen operators, functional (no
mutation, no aliasing), with PyTorch's decompositions of the operators ONNX has no
translation for, of the transformer fast path's fused operators (`fastpath`), and of the
operators whose translation a training graph cannot use (`training_norm`, `attention`); the
forward graph is split into blocks that run on Prism's devices (`CompiledGraph`), the
backward graph, when gradients are wanted, runs in PyTorch. Where AOT autograd cannot
lower a graph with all those decompositions it tries the core ones alone, and failing
that PyTorch runs the graph as dynamo captured it, after a one-line OffloadWarning.

Found by name through the `torch_dynamo_backends` entry point Prism's distribution
declares (pyproject.toml), and registered on import as well, for a source tree run
without installing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _BACKENDS, register_backend
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx import GraphModule

from runtime.errors import described
from runtime.torch.attention import ATTENTION
from runtime.torch.block import OffloadWarning
from runtime.torch.compiled import CompiledGraph
from runtime.torch.fastpath import FAST_PATH
from runtime.torch.options import OffloadOptions
from runtime.torch.refused import wrongly_decomposed
from runtime.torch.support import decompositions
from runtime.torch.training_norm import TRAINING_NORM

NAME = "prism"


def prism(gm: GraphModule, example_inputs: list[torch.Tensor],
          options: Mapping[str, Any] | OffloadOptions | None = None,
          mode: str | None = None) -> Callable:
    """The backend: dynamo calls it once per captured graph. `mode` (torch.compile's)
    changes nothing here."""
    settings = OffloadOptions.of(options)
    if (why := wrongly_decomposed(n.target for n in gm.graph.nodes
                                  if n.op == "call_function")) is not None:
        warnings.warn(f"prism: a captured graph runs in PyTorch: {why}", OffloadWarning,
                      stacklevel=2)
        return gm.forward

    def forward(fx: GraphModule, inputs: list) -> Callable:
        return make_boxed_func(CompiledGraph(fx, settings))

    def backward(fx: GraphModule, inputs: list) -> Callable:
        return make_boxed_func(fx.forward)

    failures: list[Exception] = []
    for core in (False, True):  # PyTorch's non-core decompositions are not all functional
        table = {**decompositions(core), **FAST_PATH, **TRAINING_NORM, **ATTENTION}
        lower = aot_autograd(fw_compiler=forward, bw_compiler=backward,
                             decompositions={op: fn for op, fn in table.items()
                                             if op not in settings.custom_translation_table})
        try:
            return lower(gm, example_inputs)
        except Exception as exc:  # any tracing failure: the next table, or PyTorch
            failures.append(exc)
    warnings.warn(f"prism: a captured graph runs in PyTorch: AOT autograd cannot lower it "
                  f"({described(failures[-1])})", OffloadWarning, stacklevel=2)
    return gm.forward


if NAME not in _BACKENDS:  # not yet found through the entry point (which loads this)
    register_backend(prism, NAME)
