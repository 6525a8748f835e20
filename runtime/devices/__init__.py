"""Devices: their configuration, backends and one manager per device.

Names load on first use (PEP 562): importing `runtime.devices.config` must not pull in
the manager and its backends, which import the partitioner's modules in turn.
"""

from runtime.lazy import lazy_names

_EXPORTS = {
    "Function": "runtime.devices.backends", "supported_ops": "runtime.devices.backends",
    "DeviceConfig": "runtime.devices.config", "DeviceManager": "runtime.devices.manager",
    "DeviceStats": "runtime.devices.manager", "parse_devices": "runtime.devices.spec",
    "parse_size": "runtime.devices.spec",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
