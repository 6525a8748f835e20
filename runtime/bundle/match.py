"""Fitting a bundle's devices onto a host's, by requirement: kind, memory and ops.

    placed = match_devices(bundle.manifest, host_devices, remap={"cpu3": "cpu7"})
    placed["p2"]   # the host device partition p2 goes to

Partitions that share a device in the bundle share one on the host (they share its
arena in the memory plan), and no two bundle devices share one host device. A bundle
device keeps its name where the host has a device of that name that qualifies;
otherwise it takes any that does (the smallest that fits first), found by augmenting
paths, so a fit is found whenever one exists. `remap` pins a bundle device to a host
device. A pure function: no bundle is opened, nothing is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runtime.devices.config import DeviceConfig
from runtime.errors import BundleError
from runtime.units import human_bytes


@dataclass(frozen=True)
class Need:
    """What one bundle device asks of the host device it goes to."""

    device: str  # its name in the bundle
    kind: str
    memory_bytes: int  # its partitions' weights plus its arena
    ops: frozenset[str]
    partitions: tuple[str, ...]

    @property
    def ask(self) -> str:
        parts = ", ".join(self.partitions)
        return (f"partition{'s' if len(self.partitions) > 1 else ''} {parts} (on "
                f"{self.device} in the bundle) needs a {self.kind} device with "
                f"{human_bytes(self.memory_bytes)}")

    def problem(self, device: DeviceConfig) -> str | None:
        """Why `device` cannot hold this, or None."""
        if device.backend != self.kind:
            return f"{device.name} is a {device.backend} device"
        if device.memory_bytes < self.memory_bytes:
            return f"{device.name} has {human_bytes(device.memory_bytes)}"
        missing = sorted(op for op in self.ops if not device.can_run(op))
        if missing:
            return f"{device.name} does not run {', '.join(missing)}"
        return None


def needs(manifest: Mapping) -> list[Need]:
    """The bundle's devices and what each needs, from its manifest."""
    ops: dict[str, set[str]] = {}
    for row in manifest["requirements"]:
        ops.setdefault(row["device"], set()).update(row["ops"])
    return [Need(d["name"], d["kind"], int(d["memory_bytes"]), frozenset(ops.get(d["name"], ())),
                 tuple(d["partitions"])) for d in manifest["devices"]]


def parse_remap(pairs: Sequence[str]) -> dict[str, str]:
    """`--remap old=new` flags -> {old: new}."""
    out = {}
    for pair in pairs:
        old, _, new = pair.partition("=")
        if not old or not new:
            raise BundleError(f"--remap takes OLD=NEW device names, got {pair!r}")
        out[old] = new
    return out


def _missing(need: Need, devices: Sequence[DeviceConfig]) -> str:
    """What the host lacks for `need`, said of the device that comes closest."""
    kind = [d for d in devices if d.backend == need.kind]
    if not kind:
        return (f"this host has no {need.kind} device "
                f"({', '.join(d.name for d in devices) or 'none'})")
    roomy = [d for d in kind if d.memory_bytes >= need.memory_bytes]
    if not roomy:
        largest = max(kind, key=lambda d: d.memory_bytes)
        return (f"the largest {need.kind} device, {largest.name}, has "
                f"{human_bytes(largest.memory_bytes)}")
    return "; ".join(str(need.problem(d)) for d in roomy[:2])


def match_devices(manifest: Mapping, devices: Sequence[DeviceConfig],
                  remap: Mapping[str, str] | None = None) -> dict[str, str]:
    """partition -> host device name, or BundleError naming the partition and what is
    missing."""
    wanted = needs(manifest)
    host = {d.name: d for d in devices}
    remap = dict(remap or {})
    unknown = sorted(set(remap) - {n.device for n in wanted})
    if unknown:
        raise BundleError(f"--remap {unknown[0]}=...: the bundle has no device {unknown[0]} "
                          f"(it uses {', '.join(n.device for n in wanted)})")
    for old, new in remap.items():
        if new not in host:
            raise BundleError(f"--remap {old}={new}: this host has no device {new} "
                              f"({', '.join(host)})")
    if len(set(remap.values())) < len(remap):
        raise BundleError("--remap sends two bundle devices to one host device")
    free = [d for d in devices if d.name not in set(remap.values())]
    options: dict[str, list[str]] = {}
    for need in wanted:
        if need.device in remap:
            problem = need.problem(host[remap[need.device]])
            if problem:
                raise BundleError(f"{need.ask}; --remap {need.device}={remap[need.device]}: "
                                  f"{problem}")
            options[need.device] = [remap[need.device]]
            continue
        fit = [d for d in free if need.problem(d) is None]
        if not fit:
            raise BundleError(f"{need.ask}; {_missing(need, free)}")
        fit.sort(key=lambda d: (d.name != need.device, d.memory_bytes, d.name))
        options[need.device] = [d.name for d in fit]

    owner: dict[str, str] = {}  # host device -> bundle device

    def assign(device: str, seen: set[str]) -> bool:
        for name in options[device]:
            if name not in seen:
                seen.add(name)
                if name not in owner or assign(owner[name], seen):
                    owner[name] = device
                    return True
        return False

    for need in wanted:
        if not assign(need.device, set()):
            raise BundleError(f"{need.ask}; every one that qualifies "
                              f"({', '.join(options[need.device])}) goes to another of the "
                              f"bundle's devices")
    placed = {b: h for h, b in owner.items()}
    return {p: placed[need.device] for need in wanted for p in need.partitions}
