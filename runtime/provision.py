"""Provisioner: each partition becomes a sub-model, compiled and loaded onto a device.

A partition goes to the device its plan names when that device has room; otherwise to
another device with the same backend and figures. Any failure unloads everything this
call loaded, so a failed add leaves every device as it was.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from runtime.devices.config import DeviceConfig
from runtime.devices.manager import DeviceManager
from runtime.errors import DeviceMemoryError, PrismError, ProvisionError
from runtime.graph import Graph
from runtime.partition.plan import Partition, Plan
from runtime.submodel import extract
from runtime.units import human_bytes


@dataclass(frozen=True)
class LoadedPartition:
    partition: Partition
    key: str
    device: DeviceManager


def twins(a: DeviceConfig, b: DeviceConfig) -> bool:
    """Same figures, whatever the names."""
    return replace(a, name=b.name) == b


def _candidates(devices: Mapping[str, DeviceManager], name: str) -> list[DeviceManager]:
    """The named device, then its twins (same figures but the name), by most free bytes."""
    want = devices[name].config
    others = [m for m in devices.values() if m.config.name != name and twins(m.config, want)]
    return [devices[name], *sorted(others, key=lambda m: -m.free_bytes)]


def provision(graph: Graph, plan: Plan, devices: Mapping[str, DeviceManager], *,
              network: str, tag: str = "", bus=None,
              place: Mapping[str, str] | None = None) -> list[LoadedPartition]:
    """Load every partition of `plan`, in plan order, or none of them. `place` maps the
    plan's devices to others (a replica's twins)."""
    loaded: list[LoadedPartition] = []
    try:
        for part in plan.partitions:
            if part.device not in devices:
                raise ProvisionError(f"{network}/{part.name}: plan names device {part.device}, "
                                     f"which this host does not have")
            model = extract(graph, part)
            key = f"{network}{tag}/{part.name}"
            start = time.perf_counter()
            target = (place or {}).get(part.device, part.device)
            for manager in _candidates(devices, target):
                try:
                    manager.load(key, model, part.weight_bytes, plan.arenas[part.device],
                                 part.stage_seconds)
                    break
                except DeviceMemoryError:
                    continue
            else:
                m = devices[target]
                raise DeviceMemoryError(
                    f"{network}/{part.name} needs {human_bytes(part.memory_bytes)} on "
                    f"{target}, {human_bytes(m.free_bytes)} free of "
                    f"{human_bytes(m.config.memory_bytes)}")
            loaded.append(LoadedPartition(part, key, manager))
            if bus is not None and bus.active:
                bus.publish("provision.loaded", network=network, partition=part.name,
                            device=manager.name, weight_bytes=part.weight_bytes,
                            activation_bytes=part.activation_bytes,
                            seconds=time.perf_counter() - start)
    except PrismError:
        unload(loaded, network=network, bus=bus)
        raise
    except Exception as exc:
        unload(loaded, network=network, bus=bus)
        raise ProvisionError(f"{network}: provisioning failed: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return loaded


def unload(loaded: list[LoadedPartition], *, network: str, bus=None) -> None:
    for item in reversed(loaded):
        freed = item.device.evict(item.key)
        if bus is not None and bus.active:
            bus.publish("provision.evicted", network=network, partition=item.partition.name,
                        device=item.device.name, bytes=freed)
