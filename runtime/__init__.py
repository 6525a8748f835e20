"""Prism's headless core: graph IR, cost model, partitioner, devices and (later) the host."""

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import DeviceSpecError, ModelLoadError, PartitionError, PrismError
from runtime.graph import Graph, Node, Tensor, load_graph

__all__ = ["DeviceConfig", "DeviceSpecError", "Graph", "ModelLoadError", "Node",
           "PartitionError", "PrismError", "Tensor", "load_graph", "parse_devices"]
