"""Devices: their configuration, backends and one manager per device."""

from runtime.devices.backends import Function, supported_ops
from runtime.devices.config import DeviceConfig
from runtime.devices.manager import DeviceManager, DeviceStats
from runtime.devices.spec import parse_devices, parse_size

__all__ = ["DeviceConfig", "DeviceManager", "DeviceStats", "Function", "parse_devices",
           "parse_size", "supported_ops"]
