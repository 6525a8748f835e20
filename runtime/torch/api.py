"""The plain function API, for callers who would rather not name the backend by string."""

from __future__ import annotations

import functools
from typing import Any

import torch

from runtime.torch.backend import prism
from runtime.torch.compiled import collecting
from runtime.torch.options import OffloadOptions
from runtime.torch.report import GraphReport


def compile(module: Any, *, dynamic: bool | None = None, fullgraph: bool = False,
            **options: Any) -> Any:
    """`torch.compile(module, backend="prism", options=options)` without the entry point:
    the options (as the backend's: devices, host, partition, ...) are checked now."""
    settings = OffloadOptions.of(options)
    return torch.compile(module, backend=functools.partial(prism, options=settings),
                         dynamic=dynamic, fullgraph=fullgraph)


def explain(module: Any, *example_inputs: Any, **options: Any) -> list[GraphReport]:
    """What the backend would do with `module` called on `example_inputs`: a dry run
    (blocks exported and planned over the devices, nothing loaded, every operator run
    by PyTorch); one report per graph dynamo captured."""
    compiled = compile(module, **{**options, "dry_run": True})
    with collecting() as found, torch.no_grad():
        compiled(*example_inputs)
    return list(found)
