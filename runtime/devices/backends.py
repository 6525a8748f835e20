"""Backend registry: backend name -> how to open a device of it, and which ops it runs.

Each backend module registers itself on import (like onnx.reference's op registry);
`open_device` and `supported_ops` import the backend modules on first use, so importing
this module stays cheap and free of cycles. A backend registers a device factory, so a
backend whose devices live elsewhere (another process) needs no change to the host.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.devices.config import BACKENDS, DeviceConfig
from runtime.devices.device import Device
from runtime.errors import ProvisionError
from runtime.onnx_kinds import DEFAULT_DOMAINS

if TYPE_CHECKING:
    import onnx

    from runtime.graph import Graph, Node


DeviceFactory = Callable[[DeviceConfig, Any], Device]  # (config, event bus) -> a device
OpsLister = Callable[[], frozenset[str] | None]
# (node, its graph) -> None if the backend can run the node there, else why not
Acceptor = Callable[["Node", "Graph"], str | None]


@dataclass(frozen=True)
class Backend:
    name: str
    device: DeviceFactory
    ops: OpsLister
    accepts: Acceptor | None = None


_REGISTRY: dict[str, Backend] = {}
_MODULES = {"ray": "ray.device"}  # backend -> its module, where the names differ


def register(name: str, device: DeviceFactory, ops: OpsLister,
             accepts: Acceptor | None = None) -> None:
    _REGISTRY[name] = Backend(name, device, ops, accepts)


def _backend(name: str) -> Backend:
    if name not in _REGISTRY and name in BACKENDS:
        importlib.import_module(f"runtime.devices.{_MODULES.get(name, name)}")
    if name not in _REGISTRY:
        raise ProvisionError(f"no backend named {name!r}; known: {', '.join(BACKENDS)}")
    return _REGISTRY[name]


def open_device(config: DeviceConfig, bus: Any = None) -> Device:
    """A device for `config`, of its backend's kind, publishing on `bus`."""
    return _backend(config.backend).device(config, bus)


@functools.cache
def supported_ops(name: str) -> frozenset[str] | None:
    """Default-domain op names the backend runs; None means no fixed list (config decides)."""
    return _backend(name).ops()


# A backend that computes its values with another backend's kernels (`sim` runs a
# one-thread onnxruntime session) can run a node only where that one can.
COMPUTED_BY = {"sim": "cpu", "ray": "cpu"}


def _acceptor(name: str) -> Acceptor | None:
    accepts = _backend(name).accepts
    if accepts is None and name in COMPUTED_BY:
        accepts = _backend(COMPUTED_BY[name]).accepts
    return accepts


def checks_nodes(name: str) -> bool:
    """True if the backend checks each node in its model (see `node_problem`)."""
    return _acceptor(name) is not None


def node_problem(name: str, node: Node, graph: Graph) -> str | None:
    """Why backend `name` cannot run `node` of `graph` (its opset, types, domain), or None.
    Backends without a node check accept every node their op list allows."""
    accepts = _acceptor(name)
    return None if accepts is None else accepts(node, graph)


def defines_function(schema: onnx.defs.OpSchema) -> bool:
    """Is the op defined as a function of other ops (in any context)? (Read by name: the
    attributes are missing from onnx's type stubs.)"""
    return bool(getattr(schema, "has_function", False)
                or getattr(schema, "has_context_dependent_function", False))


def schema_function_ops(max_opset: int | None = None) -> frozenset[str]:
    """Default-domain ops that onnx defines as a function of other ops.

    Runtimes that lack a kernel for such an op inline its body instead, so both
    onnxruntime and the reference evaluator run them.
    """
    import onnx  # here, not above: opening a device (a bundle's host) needs no onnx

    out = set()
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain not in DEFAULT_DOMAINS or not defines_function(schema):
            continue
        if max_opset is None or schema.since_version <= max_opset:
            out.add(schema.name)
    return frozenset(out)
