"""Devices in a canonical order, by capability: the partitioner and replication take
them so, so neither the order they were listed in nor their names change a plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runtime.devices.config import DeviceConfig


def canonical_devices(devices: Sequence[DeviceConfig],
                      pinned: Mapping[str, tuple[int, ...]] | None = None) -> list[DeviceConfig]:
    """Devices by capability, so neither the order they were listed in nor their names
    change a plan. Twins are told apart by the nodes pinned to them (`pinned`: device ->
    positions of nodes placement allows only there) before their names."""
    pinned = pinned or {}
    return sorted(devices, key=lambda d: (
        -d.memory_bytes, -d.peak_flops, -d.mem_bandwidth, -d.link_bandwidth, d.launch_seconds,
        d.link_latency, d.backend, d.threads, sorted(d.supported_ops or ()),
        d.supported_ops is not None, pinned.get(d.name, ()), d.name))
