"""Parse `--devices`: a compact spec (`cpu:2,sim:4:mem=64MB`) or a TOML file of device tables."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from runtime.devices.config import BACKENDS, DeviceConfig
from runtime.errors import DeviceSpecError

# Devices in one spec. Partitioning is linear in the device count (about 1 s at 10,000
# twins), but each device is a manager, a worker and a session per partition it holds:
# a thousand is far past any real host, and a typo (cpu:99999) is caught at once.
MAX_DEVICES = 1024
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
          "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12,
          "tib": 1 << 40, "p": 1e15, "pb": 1e15, "pib": 1 << 50}
_KEYS = {"mem": "memory_bytes", "memory": "memory_bytes", "threads": "threads",
         "flops": "peak_flops", "bw": "mem_bandwidth", "link": "link_bandwidth",
         "ops": "supported_ops", "int8": "int8_ops", "precision": "precisions",
         "timing": "timing", "node": "node", "resources": "resources",
         "spin": "spin"}
_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}


def parse_size(text: str | int | float) -> float:
    """'64MB' -> 64e6, '1GiB' -> 2**30, '2.5T' -> 2.5e12; plain numbers pass through."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)(e[+-]?\d+)?\s*([a-zA-Z]*)(/s)?\s*",
                         str(text), re.IGNORECASE)
    unit = match and match.group(3).lower()
    if not match or unit not in _UNITS:
        raise DeviceSpecError(f"cannot read size {text!r}; write e.g. 512MB, 2GiB or 1e9")
    return float(match.group(1) + (match.group(2) or "")) * _UNITS[unit]


def _number(name: str, key: str, value: object, kind: type) -> float | int:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise DeviceSpecError(f"device {name}: {key} must be a number, got {value!r}") from None
    if number < 0:
        raise DeviceSpecError(f"device {name}: {key} must not be negative, got {value!r}")
    return number


def _device_fields(name: str, options: dict) -> dict:
    out: dict[str, object] = {}
    for key, value in options.items():
        target = _KEYS.get(key, key)
        if target in ("supported_ops", "precisions"):  # `ops=Conv+Relu`, `precision=int8`
            ops = value if isinstance(value, list) else str(value).split("+")
            out[target] = [str(op) for op in ops if str(op)]
        elif target == "threads":
            if isinstance(value, float) or not _whole(str(value)):
                raise DeviceSpecError(f"device {name}: threads must be a whole number, "
                                      f"got {value!r}")
            out[target] = int(value)
        elif target in ("memory_bytes", "peak_flops", "mem_bandwidth", "link_bandwidth",
                        "int8_ops"):
            out[target] = parse_size(value)
        elif target in ("launch_seconds", "link_latency"):
            out[target] = _number(name, key, value, float)
        elif target == "spin":  # `spin=0`; in TOML, spin = false
            if str(value).lower() not in _SWITCH:
                raise DeviceSpecError(f"device {name}: spin must be 0 or 1, got {value!r}")
            out[target] = _SWITCH[str(value).lower()]
        elif target in ("timing", "node"):  # ray: `timing=sim`, `node=10.0.0.5`
            out[target] = str(value)
        elif target == "resources":  # ray, in TOML: resources = {GPU = 1, fast = 0.5}
            if not isinstance(value, dict):
                raise DeviceSpecError(f"device {name}: resources must be a table of Ray "
                                      f"resource amounts, got {value!r}")
            out[target] = {k: _number(name, f"resources.{k}", v, float)
                           for k, v in value.items()}
        elif target != "backend":
            raise DeviceSpecError(f"device {name}: unknown option {key!r}")
    return out


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit()  # "²".isdigit() holds, but int("²") fails


def _from_toml(path: Path) -> list[DeviceConfig]:
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DeviceSpecError(f"cannot read device file {path}: {exc}") from None
    tables = tables.get("devices", tables)
    if not isinstance(tables, dict):
        raise DeviceSpecError(f"{path}: expected one [table] per device")
    devices = []
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise DeviceSpecError(f"{path}: [{name}] must be a table of device settings")
        devices.append(DeviceConfig(name=name, backend=table.get("backend", "cpu"),
                                    **_device_fields(name, table)))
    return devices


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a spec longer than a file name may be
        return False


def parse_devices(spec: str | Path) -> list[DeviceConfig]:
    """Devices from a compact spec or a TOML file; names are `<backend><index>` per kind."""
    path = Path(spec)
    if str(spec).endswith(".toml") or _is_file(path):
        if not _is_file(path):
            raise DeviceSpecError(f"device file not found: {spec}")
        devices = _from_toml(path)
    else:
        devices = []
        for part in filter(None, (p.strip() for p in str(spec).split(","))):
            kind, *rest = part.split(":")
            count = 1
            if rest and _whole(rest[0]):
                count = int(rest.pop(0))
            if kind not in BACKENDS:
                raise DeviceSpecError(f"unknown device kind {kind!r} in {spec!r}; "
                                      f"choose one of {', '.join(BACKENDS)}")
            if not 1 <= count <= MAX_DEVICES:
                raise DeviceSpecError(f"{part!r} asks for {count or 'no'} devices; give 1 to "
                                      f"{MAX_DEVICES}")
            options = dict(opt.partition("=")[::2] for opt in rest)
            taken = sum(d.backend == kind for d in devices)
            for i in range(count):
                name = f"{kind}{taken + i}"
                devices.append(DeviceConfig(name=name, backend=kind,
                                            **_device_fields(name, options)))
    if not devices:
        raise DeviceSpecError(f"no devices in {str(spec)!r}; write e.g. cpu:2 or cpu:2,sim:4")
    if len(devices) > MAX_DEVICES:
        raise DeviceSpecError(f"{str(spec)!r} holds {len(devices)} devices; at most "
                              f"{MAX_DEVICES}")
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise DeviceSpecError(f"device names repeat in {str(spec)!r}: {names}")
    return devices
