"""Provisioner: each partition's program loaded onto a device.

A partition goes to the device its plan names when that device has room; otherwise to
another device with the same backend and figures. Any failure unloads everything this
call loaded, so a failed add leaves every device as it was. Programs are made once per
plan (extracted just in time by `from_model.Programs`, each as it is first loaded, or read
from a bundle) and loaded once per replica; what each load frees goes back to the system
(`heap.give_back`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device, Program
from runtime.errors import DeviceMemoryError, PrismError, ProvisionError, first_line
from runtime.executor.executor import LoadedPartition
from runtime.heap import give_back
from runtime.partition.plan import Partition, Plan


def twins(a: DeviceConfig, b: DeviceConfig) -> bool:
    """Same figures, whatever the names."""
    return a.figures() == b.figures()


def twin_groups(devices: Iterable[Device]) -> dict[tuple, list[Device]]:
    """Devices by their figures, made once per load rather than per partition and device."""
    groups: dict[tuple, list[Device]] = {}
    for d in devices:
        groups.setdefault(d.config.figures(), []).append(d)
    return groups


@contextmanager
def one_line_errors(network: str) -> Iterator[None]:
    """Errors Prism did not raise on purpose become one-line ProvisionErrors."""
    try:
        yield
    except PrismError:
        raise
    except Exception as exc:
        raise ProvisionError(f"{network}: provisioning failed: {type(exc).__name__}: "
                             f"{first_line(exc)}") from exc


def _candidates(devices: Mapping[str, Device], groups: Mapping[tuple, list[Device]],
                name: str) -> Iterator[Device]:
    """The named device, then (asked for only when it is full) its twins, by most free
    bytes."""
    want = devices[name]
    yield want
    others = [d for d in groups[want.config.figures()] if d is not want]
    yield from sorted(others, key=lambda d: -d.free_bytes)


def provision(plan: Plan, made: Mapping[str, Program], devices: Mapping[str, Device], *,
              network: str, tag: str = "", bus: Any = None,
              onto: Mapping[str, str] | None = None,
              groups: Mapping[tuple, list[Device]] | None = None) -> list[LoadedPartition]:
    """Load every partition of `plan`, in plan order, or none of them. `onto` maps the
    plan's devices to others (a replica's twins); `tag` tells a replica's keys apart;
    `groups` is `twin_groups(devices)` when the caller has it (one per replica costs)."""
    loaded: list[LoadedPartition] = []
    groups = twin_groups(devices.values()) if groups is None else groups
    try:
        with one_line_errors(network):
            for part in plan.partitions:
                target = (onto or {}).get(part.device, part.device)
                loaded.append(_load(part, made[part.name], devices, groups, network, tag,
                                   target, bus))
                give_back()  # what its program and compiling it freed, before the next
    except BaseException:
        unload(loaded, network=network, bus=bus)
        raise
    return loaded


def _load(part: Partition, program: Program, devices: Mapping[str, Device],
          groups: Mapping[tuple, list[Device]], network: str, tag: str, target: str, bus: Any
          ) -> LoadedPartition:
    if target not in devices:
        raise ProvisionError(f"{network}/{part.name}: plan names device {target}, which this "
                             f"host does not have")
    key, start = f"{network}{tag}/{part.name}", time.perf_counter()
    refusal: DeviceMemoryError | None = None
    for device in _candidates(devices, groups, target):
        try:
            device.load(key, program)
            break
        except DeviceMemoryError as exc:  # the planned device's own account is the one said:
            refusal = refusal or exc      # what it lacks counts the arena it already has
    else:
        assert refusal is not None  # the planned device is always a candidate
        if refusal.needed is None or refusal.free is None or refusal.total is None:
            raise refusal
        copy = f" (replica {tag.lstrip('#')})" if tag else ""
        raise DeviceMemoryError.short(f"{network}/{part.name}{copy}", target, refusal.needed,
                                      refusal.free, refusal.total) from None
    if bus is not None and bus.active:
        bus.publish("provision.loaded", network=network, partition=part.name,
                    device=device.name, weight_bytes=part.weight_bytes,
                    activation_bytes=part.activation_bytes, seconds=time.perf_counter() - start)
    return LoadedPartition(part, key, device)


def unload(loaded: Sequence[LoadedPartition], *, network: str, bus: Any = None) -> None:
    for item in reversed(loaded):
        freed = item.device.unload(item.key)
        if bus is not None and bus.active:
            bus.publish("provision.evicted", network=network, partition=item.partition.name,
                        device=item.device.name, bytes=freed)
    give_back()
