"""Prism's headless core: graph IR, cost model, partitioner, devices and the host.

Names load on first use (PEP 562), so `import runtime.driver` pulls in neither the
partitioner nor onnx: the bundle driver runs with numpy and onnxruntime alone.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.devices import DeviceConfig, parse_devices  # noqa: F401
    from runtime.errors import DeviceSpecError, ModelLoadError, PartitionError, PrismError  # noqa: F401
    from runtime.graph import Graph, Node, Tensor, load_graph  # noqa: F401
    from runtime.host.manager import HostManager  # noqa: F401
    from runtime.partition import Partition, Plan, Transfer  # noqa: F401

_EXPORTS = {
    "DeviceConfig": "runtime.devices", "parse_devices": "runtime.devices",
    "DeviceSpecError": "runtime.errors", "ModelLoadError": "runtime.errors",
    "PartitionError": "runtime.errors", "PrismError": "runtime.errors",
    "Graph": "runtime.graph", "Node": "runtime.graph", "Tensor": "runtime.graph",
    "load_graph": "runtime.graph", "HostManager": "runtime.host.manager",
    "Partition": "runtime.partition", "Plan": "runtime.partition",
    "Transfer": "runtime.partition",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
