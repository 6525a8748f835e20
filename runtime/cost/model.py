"""The cost model a plan is made with: the roofline, or times measured on the machine.

    model = CostModel.roofline(graph)                     # costs="model"
    model = CostModel(graph_costs(graph), {kind: Timings(...)}, hops={"cpu": 3e-5})

A node's time on a device is its measured time when the device's kind was timed
(`kind_of`: onnxruntime on CPU at a thread count, what `cpu` and `ray` devices run) and
the node was, else the roofline's (`roofline.device_seconds`), so a node never timed (a
`sim` device, a node whose sub-model could not run) still has a time. A measured device
also pays a fixed cost per partition run (`run_seconds`: handing feeds to onnxruntime
and taking outputs back, what a partition's run time has beyond its kernels) and a
`hop` per run (dispatching the run to the device: a thread hand-off in process, a Ray
call to an actor), while each tensor copied costs only its bytes over the link. Under
the roofline (nothing timed) a copy costs `link_latency` per tensor, as before.

Every figure is a device's own: a stage's time depends only on its nodes and its device,
which keeps the balanced split exact (`partition/balanced.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from runtime.cost.roofline import (
    NodeCost,
    device_seconds,
    graph_costs,
    link_seconds,
    sends_over_link,
)
from runtime.devices.config import DeviceConfig
from runtime.graph import Graph


def kind_of(device: DeviceConfig) -> str | None:
    """The kind of device measured times carry over between (onnxruntime's CPU provider at
    a thread count, as `cpu` devices and `ray` actors run it), or None for a device whose
    time is modelled (`sim`, a `ray` actor keeping sim time, the `reference` evaluator).
    Threads that sleep between runs (`spin=0`) are a kind of their own; one thread alone
    has none to spin."""
    if device.backend == "cpu" or (device.backend == "ray" and device.timing == "cpu"):
        still = "/still" if not device.spin and device.threads > 1 else ""
        return f"ort-cpu/{device.threads}{still}"
    return None


@dataclass(frozen=True)
class Timings:
    """Times measured on one kind of device: seconds per node (its kernels), the fixed
    cost of one partition run, and where they came from (`measured` at load by timing
    sub-models, `live` from the runs of a loaded plan)."""

    nodes: Mapping[str, float]
    run_seconds: float = 0.0
    source: str = "measured"

    def to_dict(self) -> dict:
        return {"nodes": dict(self.nodes), "run_seconds": self.run_seconds,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping) -> Timings:
        return cls({str(k): float(v) for k, v in data["nodes"].items()},
                   float(data["run_seconds"]), str(data.get("source", "measured")))


@dataclass(frozen=True)
class CostModel:
    """Per node, per device: seconds. `timings`: by device kind (`kind_of`); `hops`: by
    backend, the measured seconds one run's dispatch to such a device costs it."""

    costs: Mapping[str, NodeCost]
    timings: Mapping[str, Timings] = field(default_factory=dict)
    hops: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def roofline(cls, graph: Graph) -> CostModel:
        return cls(graph_costs(graph))

    @property
    def name(self) -> str:
        """How the plan's times were made: `model` (roofline), `measured` or `live`."""
        sources = {t.source for t in self.timings.values()}
        return "live" if "live" in sources else "measured" if sources else "model"

    def timed(self, device: DeviceConfig) -> Timings | None:
        kind = kind_of(device)
        return None if kind is None else self.timings.get(kind)

    def node_seconds(self, node: str, device: DeviceConfig) -> float:
        timed = self.timed(device)
        if timed is not None and node in timed.nodes:
            return timed.nodes[node]
        return device_seconds(self.costs[node], device)

    def run_seconds(self, device: DeviceConfig) -> float:
        """The fixed cost of one partition run on the device, beyond its nodes."""
        timed = self.timed(device)
        return timed.run_seconds if timed is not None else 0.0

    def hopped(self, device: DeviceConfig) -> bool:
        """Was dispatching a run to this kind of device measured?"""
        return device.backend in self.hops and self.timed(device) is not None

    def hop_seconds(self, device: DeviceConfig) -> float:
        """What dispatching one run to the device costs it (0 when not measured)."""
        return self.hops[device.backend] if self.hopped(device) else 0.0

    def fixed_seconds(self, device: DeviceConfig) -> float:
        """Every partition on the device pays this once per run: its run's fixed cost and
        its dispatch."""
        return self.run_seconds(device) + self.hop_seconds(device)

    def latency(self, device: DeviceConfig) -> float:
        """A copy's fixed cost per tensor at the device's end: its link latency, unless its
        dispatch was measured (then the hop, paid once per run, holds it)."""
        return 0.0 if self.hopped(device) else device.link_latency

    def receive_seconds(self, nbytes: int, device: DeviceConfig) -> float:
        """The receiving end of a copy of `nbytes`."""
        if self.hopped(device):
            return nbytes / device.link_bandwidth
        return link_seconds(nbytes, device)

    def send_seconds(self, nbytes: int, device: DeviceConfig) -> float:
        """The sending end: nothing for a device working in host memory."""
        return self.receive_seconds(nbytes, device) if sends_over_link(device) else 0.0

    def transfer_seconds(self, nbytes: int, src: DeviceConfig, dst: DeviceConfig) -> float:
        """A copy's time: the slower of its two ends (`roofline.transfer_seconds`)."""
        return max(self.send_seconds(nbytes, src), self.receive_seconds(nbytes, dst))
