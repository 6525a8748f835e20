"""The plan `HostManager.add_network` makes for a network: its mode or map, placement
options and replicas (one replica's share of the devices). `prism compile` plans with it,
so a bundle holds the same plan the host would make."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runtime.devices.config import DeviceConfig
from runtime.graph import Graph
from runtime.partition import MODES, Plan, partition_steps
from runtime.partition.record import finish, tap
from runtime.partition.replicas import planned_over
from runtime.partition.steps import Step

PartitionSpec = str | Path | Mapping  # a mode, or a user map (file or mapping)


def plan_network(graph: Graph, devices: Sequence[DeviceConfig],
                 partition: PartitionSpec = "balanced", *,
                 annotations: str | Path | Mapping | None = None, fallback: str | None = None,
                 replicas: int | str = 1, on_step: Callable[[Step], None] | None = None
                 ) -> tuple[list[Step], Plan]:
    """The plan and the partitioner's steps that made it. A replica search may try several
    device sets: `on_step` sees every step of every try (for progress), the steps returned
    are the kept plan's."""
    if isinstance(partition, str) and partition in MODES:
        mode, user_map = partition, None
    else:
        mode, user_map = "user", partition

    def attempt(some: list[DeviceConfig]) -> tuple[list[Step], Plan]:
        steps: list[Step] = []

        def keep(step: Step) -> None:
            steps.append(step)
            if on_step is not None:
                on_step(step)

        plan = finish(tap(partition_steps(graph, some, mode, user_map=user_map,
                                          annotations=annotations, fallback=fallback), keep))
        return steps, plan

    return planned_over(list(devices), replicas, attempt, graph)
