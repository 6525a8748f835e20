"""Devices: their configuration, the Device interface, backends and the in-process device."""

from runtime.devices.backends import open_device, supported_ops
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device, DeviceStats, Program
from runtime.devices.manager import DeviceManager, Function
from runtime.devices.spec import parse_devices, parse_size

__all__ = ["Device", "DeviceConfig", "DeviceManager", "DeviceStats", "Function", "Program",
           "open_device", "parse_devices", "parse_size", "supported_ops"]
