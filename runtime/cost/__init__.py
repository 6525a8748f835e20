"""The cost model: what a node, a partition run and a copy cost on a device.

`roofline.py` models them from FLOPs, bytes and a device's figures; `model.py` holds the
`CostModel` a plan is made with (measured times where a device's kind was timed, the
roofline elsewhere); `cache.py` keeps measured times between loads, in the user's cache
directory.

Names load on first use (PEP 562): `COSTS` alone (what a server checks a load parameter
against) imports neither the graph IR nor onnx.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

COSTS = ("measured", "model")  # what `costs=` takes: measured on this machine, or the roofline

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.cost.model import CostModel, Timings, kind_of  # noqa: F401
    from runtime.cost.roofline import (  # noqa: F401
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

_EXPORTS = {
    **dict.fromkeys(("CostModel", "Timings", "kind_of"), "runtime.cost.model"),
    **dict.fromkeys(("HOST_MEMORY_BACKENDS", "NodeCost", "device_seconds", "graph_costs",
                     "link_seconds", "node_cost", "send_seconds", "sends_over_link",
                     "transfer_seconds"), "runtime.cost.roofline"),
}

__all__ = sorted([*_EXPORTS, "COSTS"])

__getattr__ = lazy_names(__name__, _EXPORTS)
