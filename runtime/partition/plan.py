"""Plan: a DAG of partitions on devices, with the tensor transfers between them.

Plain records, light to import: a host loading an ahead-of-time bundle rebuilds its plan
from JSON without the partitioner (`build.py` makes plans from a graph).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from runtime.devices.config import DeviceConfig

if TYPE_CHECKING:
    from runtime.graph import Graph

MODES = ("memory", "balanced", "user")  # how a plan is made


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    device: str
    backend: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[str, ...]
    weight_bytes: int
    activation_bytes: int
    est_seconds: float  # compute
    transfer_in_seconds: float = 0.0  # its end of the copies in (link_seconds)
    flops: float = 0.0
    transfer_out_seconds: float = 0.0  # its end of the copies out (send_seconds), once each

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def stage_seconds(self) -> float:
        """What one run holds its device for: compute and its ends of the copies."""
        return self.est_seconds + self.transfer_in_seconds + self.transfer_out_seconds


@dataclass(frozen=True)
class Transfer:
    """A tensor copied once from its producer's device to one consuming device;
    `est_seconds` is the copy's time, the slower of the two links (`transfer_seconds`)."""

    tensor: str
    src: str
    dst: str
    bytes: int
    est_seconds: float
    src_partition: str
    dst_partitions: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """Complete when built: nothing changes a plan after `build_plan` (a plan with other
    reasons is another plan, `dataclasses.replace`)."""

    network: str
    mode: str
    devices: list[DeviceConfig]
    partitions: list[Partition]
    transfers: list[Transfer]
    bottleneck_seconds: float
    device_seconds: dict[str, float]
    order: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    arenas: dict[str, int] = field(default_factory=dict)  # device -> activation peak
    precisions: dict[str, str | None] = field(default_factory=dict)  # node -> float/int8/None
    # no split of the graph over these devices beats this (`partition/bound.py`)
    lower_bound_seconds: float = 0.0
    costs: str = "model"  # the cost model it was made with: model, measured or live

    @property
    def gap(self) -> float:
        """How far the bottleneck is above the lower bound, as a share of the bound."""
        if self.lower_bound_seconds <= 0:
            return 0.0
        return self.bottleneck_seconds / self.lower_bound_seconds - 1.0

    def partition(self, name: str) -> Partition:
        return next(p for p in self.partitions if p.name == name)

    def partition_of(self, node: str) -> Partition:
        return next(p for p in self.partitions if node in p.nodes)

    def device(self, name: str) -> DeviceConfig:
        return next(d for d in self.devices if d.name == name)

    def moved(self, where: Mapping[str, str], configs: Mapping[str, DeviceConfig]) -> Plan:
        """The plan with partition `p` on device `where[p]` (configured as `configs[...]`):
        how a provisioner that put a partition on a twin of its planned device records
        where it runs. A twin has the planned device's figures, so times stay as they were;
        each device's busy time and arena follow its partitions."""
        if all(where.get(p.name, p.device) == p.device for p in self.partitions):
            return self
        partitions = [replace(p, device=where.get(p.name, p.device)) for p in self.partitions]
        device_of = {p.name: p.device for p in partitions}
        transfers = [replace(t, src=device_of[t.src_partition],
                             dst=device_of[t.dst_partitions[0]]) for t in self.transfers]
        arenas: dict[str, int] = {}
        for old, new in zip(self.partitions, partitions, strict=True):
            arenas[new.device] = max(arenas.get(new.device, 0), self.arenas.get(old.device, 0))
        names = list(dict.fromkeys([*(d.name for d in self.devices), *arenas]))
        known = {d.name: d for d in self.devices}
        busy = device_busy(partitions, names)
        return replace(self, partitions=partitions, transfers=transfers,
                       devices=[configs.get(n) or known[n] for n in names],
                       device_seconds=busy, bottleneck_seconds=max(busy.values(), default=0.0),
                       arenas=arenas)

    def with_estimates(self, seconds: Mapping[str, float]) -> Plan:
        """The plan with partition `p` estimated at `seconds[p]` (its compute: what its
        runs took), each device's busy time following; a live plan (`costs`)."""
        partitions = [replace(p, est_seconds=seconds.get(p.name, p.est_seconds))
                      for p in self.partitions]
        busy = device_busy(partitions, self.device_seconds)
        return replace(self, partitions=partitions, device_seconds=busy,
                       bottleneck_seconds=max(busy.values(), default=0.0), costs="live")

    def device_memory(self) -> dict[str, int]:
        """Bytes each device needs: every partition's weights, plus one activation arena,
        the peak of the device's memory plan (its partitions run one at a time, and a
        tensor kept between two of them counts while it waits)."""
        weights = dict.fromkeys((d.name for d in self.devices), 0)
        for p in self.partitions:
            weights[p.device] += p.weight_bytes
        return {name: w + self.arenas.get(name, 0) for name, w in weights.items()}

    def to_dict(self) -> dict:
        return {
            "network": self.network,
            "mode": self.mode,
            "bottleneck_seconds": self.bottleneck_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "costs": self.costs,
            "devices": [d.to_dict() for d in self.devices],
            "device_seconds": self.device_seconds,
            "partitions": [asdict(p) for p in self.partitions],
            "transfers": [asdict(t) for t in self.transfers],
            "order": list(self.order),
            "reasons": self.reasons,
            "precisions": self.precisions,
            "arenas": dict(self.arenas),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_dot(self, graph: Graph | None = None) -> str:
        """Graphviz: a cluster per partition coloured by device, a copy node per transfer."""
        from runtime.partition.dot import Outline, plan_dot, scheme_inks

        inks = scheme_inks(d.name for d in self.devices)
        return plan_dot(self, inks, Outline.of(graph) if graph is not None else None)


def device_busy(partitions: Iterable[Partition], devices: Iterable[str]) -> dict[str, float]:
    """Each device's busy time per request: the stage times of its partitions (`devices`
    first, in their order, each at least 0)."""
    busy = dict.fromkeys(devices, 0.0)
    for p in partitions:
        busy[p.device] = busy.get(p.device, 0.0) + p.stage_seconds
    return busy
