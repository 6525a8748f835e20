"""The measured dispatch cost (`devices.hop`) of a host's own devices, once per device
pair: a load after the first costs nothing."""

from __future__ import annotations

from collections.abc import Mapping
from weakref import WeakKeyDictionary

from runtime.cost import kind_of
from runtime.devices.device import Device
from runtime.devices.hop import measure_hop

_measured: WeakKeyDictionary[Device, float | None] = WeakKeyDictionary()


def device_hops(devices: Mapping[str, Device]) -> dict[str, float]:
    """Backend -> seconds one run's dispatch costs its devices, for the backends whose
    devices are of a measured kind (`cost.kind_of`): timed on two of them (one if that
    is all), remembered per device."""
    by_backend: dict[str, list[Device]] = {}
    for device in devices.values():
        if kind_of(device.config) is not None:
            by_backend.setdefault(device.config.backend, []).append(device)
    hops = {}
    for backend, group in by_backend.items():
        first = group[0]
        if first not in _measured:
            _measured[first] = measure_hop(group[:2])
        hop = _measured[first]
        if hop is not None:
            hops[backend] = hop
    return hops
