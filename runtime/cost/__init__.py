"""The cost model: what a node, a partition run and a copy cost on a device.

`roofline.py` models them from FLOPs, bytes and a device's figures; `model.py` holds the
`CostModel` a plan is made with (measured times where a device's kind was timed, the
roofline elsewhere); `cache.py` keeps measured times between loads, in the user's cache
directory.
"""

from runtime.cost.model import COSTS, CostModel, Timings, kind_of
from runtime.cost.roofline import (
    HOST_MEMORY_BACKENDS,
    NodeCost,
    device_seconds,
    graph_costs,
    link_seconds,
    node_cost,
    send_seconds,
    sends_over_link,
    transfer_seconds,
)

__all__ = ["COSTS", "HOST_MEMORY_BACKENDS", "CostModel", "NodeCost", "Timings",
           "device_seconds", "graph_costs", "kind_of", "link_seconds", "node_cost",
           "send_seconds", "sends_over_link", "transfer_seconds"]
