"""Devices: their configuration (`config`, `spec`), the Device interface (`device`), the
backend registry (`backends`), the in-process device (`manager`) and one module per
backend (`cpu`, `sim`, `reference`; `ray/` for devices that are Ray actors), with
onnxruntime's part in `ort/`.

Names load on first use (PEP 562): importing `runtime.devices.config` alone must not
pull in the devices and their backends.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.devices.backends import open_device, supported_ops  # noqa: F401
    from runtime.devices.config import DeviceConfig  # noqa: F401
    from runtime.devices.device import Device, DeviceStats, Program  # noqa: F401
    from runtime.devices.manager import DeviceManager, Function  # noqa: F401
    from runtime.devices.spec import parse_devices, parse_size  # noqa: F401

_EXPORTS = {
    "open_device": "runtime.devices.backends", "supported_ops": "runtime.devices.backends",
    "DeviceConfig": "runtime.devices.config", "Device": "runtime.devices.device",
    "DeviceStats": "runtime.devices.device", "Program": "runtime.devices.device",
    "DeviceManager": "runtime.devices.manager", "Function": "runtime.devices.manager",
    "parse_devices": "runtime.devices.spec", "parse_size": "runtime.devices.spec",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
