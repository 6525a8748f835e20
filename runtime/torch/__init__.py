"""PyTorch offload: `torch.compile(module, backend="prism")` runs a module's graph on
Prism's devices. The one room that imports torch (installed with Prism's `torch` extra);
the rest of `runtime` imports without it. Importing this package registers the backend
(an installed Prism is also found through its entry point, without the import); its other
names load on first use.

`backend`: the dynamo backend (AOT autograd to ATen, then a split per captured graph).
`compiled`: one captured graph split and run. `split`: supported nodes fused into blocks.
`support`: which nodes may leave PyTorch, and why others stay (`refused`: operators the
qualification sweep found wrong). `block`: a block at run time (export per kind of input,
a network on the host, falling back to PyTorch). `export`: a block to ONNX. `tensors`:
torch <-> numpy without copies. `report`: the records a report is made of. `options`,
`hosts`: the backend's options and the hosts it opens. `api`: `compile` and `explain`.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

try:
    import torch  # noqa: F401
except ImportError as exc:  # one line, saying what to install
    raise ImportError("runtime.torch needs PyTorch: pip install 'prism-runtime[torch]'") \
        from exc

from runtime.torch import backend as _backend  # noqa: F401 (registers "prism" with dynamo)

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.torch.api import compile, explain  # noqa: F401
    from runtime.torch.backend import prism  # noqa: F401
    from runtime.torch.block import OffloadWarning  # noqa: F401
    from runtime.torch.compiled import reports  # noqa: F401
    from runtime.torch.options import OffloadOptions  # noqa: F401
    from runtime.torch.report import GraphReport  # noqa: F401

_EXPORTS = {
    "compile": "runtime.torch.api", "explain": "runtime.torch.api",
    "prism": "runtime.torch.backend", "OffloadWarning": "runtime.torch.block",
    "reports": "runtime.torch.compiled", "OffloadOptions": "runtime.torch.options",
    "GraphReport": "runtime.torch.report",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
