"""The plan `HostManager.add_network` makes for a network: its mode or map, placement
options and replicas (one copy's share of the devices), the partitioner's steps shown to
`on_step` as they come. `prism compile` plans with it, so a bundle holds the same plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition import MODES, Plan, partition_steps
from runtime.partition import partition as partition_plan
from runtime.partition.record import finish, tap
from runtime.partition.steps import Step
from runtime.replicas import plan_devices


def plan_network(graph: Graph, devices: Sequence[DeviceConfig],
                 partition: str | Path | Mapping = "balanced", *, annotations=None,
                 fallback: str | None = None, replicas: int | str = 1,
                 on_step: Callable[[Step], None] | None = None) -> Plan:
    if isinstance(partition, str) and partition in MODES:
        mode, user_map = partition, None
    else:
        mode, user_map = "user", partition
    options = {"user_map": user_map, "annotations": annotations, "fallback": fallback}
    devices = list(devices)
    if replicas != 1:
        def fits(some: list[DeviceConfig]) -> bool:
            try:
                return bool(partition_plan(graph, some, mode, **options))
            except PartitionError:
                return False
        devices = plan_devices(devices, replicas, fits)
    return finish(tap(partition_steps(graph, devices, mode, **options),
                      on_step or (lambda step: None)))
