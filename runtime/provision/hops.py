"""The measured dispatch cost (`devices.hop`) of a host's devices: in-process `cpu`
devices' from the cache (measured once on this machine, `planning.cpu_hops`), devices in
another process (`ray` actors) timed on the host's own, once per device pair, so a load
after the first costs nothing."""

from __future__ import annotations

from collections.abc import Mapping
from weakref import WeakKeyDictionary

from runtime.cost import kind_of
from runtime.devices.device import Device
from runtime.devices.hop import measure_hop
from runtime.partition.planning import cpu_hops

_measured: WeakKeyDictionary[Device, float | None] = WeakKeyDictionary()


def device_hops(devices: Mapping[str, Device]) -> dict[str, float]:
    """Backend -> seconds one run's dispatch costs its devices, for the backends whose
    devices are of a measured kind (`cost.kind_of`)."""
    configs = [d.config for d in devices.values()]
    hops = cpu_hops(configs)
    remote: dict[str, list[Device]] = {}
    for device in devices.values():
        if kind_of(device.config) is not None and device.config.backend != "cpu":
            remote.setdefault(device.config.backend, []).append(device)
    for backend, group in remote.items():
        first = group[0]
        if first not in _measured:
            _measured[first] = measure_hop(group[:2])
        hop = _measured[first]
        if hop is not None:
            hops[backend] = hop
    return hops
