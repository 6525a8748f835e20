"""Devices: their configuration and (later) one manager per device."""

from runtime.devices.config import DeviceConfig
from runtime.devices.spec import parse_devices, parse_size

__all__ = ["DeviceConfig", "parse_devices", "parse_size"]
