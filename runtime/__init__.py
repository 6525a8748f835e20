"""Prism's headless core: graph IR, cost model, partitioner, devices and (later) the host."""

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import DeviceSpecError, ModelLoadError, PartitionError, PrismError
from runtime.graph import Graph, Node, Tensor, load_graph
from runtime.host import HostManager
from runtime.partition import Partition, Plan, Transfer

__all__ = ["DeviceConfig", "DeviceSpecError", "Graph", "HostManager", "ModelLoadError", "Node",
           "Partition", "PartitionError", "Plan", "PrismError", "Tensor", "Transfer",
           "load_graph", "parse_devices"]
