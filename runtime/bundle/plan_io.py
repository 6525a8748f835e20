"""A Plan to JSON and back, without running the partitioner again.

`plan_from_dict` rebuilds an equal Plan from `Plan.to_dict()` (JSON floats round-trip
exactly). `rename_devices` moves a plan onto other device names (a bundle's devices
matched to a host's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from runtime.devices.config import DeviceConfig
from runtime.partition.plan import Partition, Plan, Transfer


def _tuples(record: Mapping) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}


def _device(record: Mapping) -> DeviceConfig:
    ops = record.get("supported_ops")
    return DeviceConfig(**{**record, "supported_ops": None if ops is None else frozenset(ops)})


def plan_from_dict(data: Mapping) -> Plan:
    return Plan(network=data["network"], mode=data["mode"],
                devices=[_device(d) for d in data["devices"]],
                partitions=[Partition(**_tuples(p)) for p in data["partitions"]],
                transfers=[Transfer(**_tuples(t)) for t in data["transfers"]],
                bottleneck_seconds=data["bottleneck_seconds"],
                device_seconds=dict(data["device_seconds"]), order=tuple(data["order"]),
                reasons=dict(data["reasons"]), arenas=dict(data.get("arenas", {})),
                precisions=dict(data.get("precisions", {})),
                lower_bound_seconds=float(data.get("lower_bound_seconds", 0.0)),
                costs=str(data.get("costs", "model")))


def rename_devices(plan: Plan, names: Mapping[str, str],
                   configs: Mapping[str, DeviceConfig] | None = None) -> Plan:
    """The plan with device `old` called `names[old]` (and, if given, configured as
    `configs[new]`), everything else as it was."""
    def new(old: str) -> str:
        return names.get(old, old)

    configs = configs or {}
    return replace(plan, devices=[configs.get(new(d.name)) or d.with_name(new(d.name))
                                  for d in plan.devices],
                   partitions=[replace(p, device=new(p.device)) for p in plan.partitions],
                   transfers=[replace(t, src=new(t.src), dst=new(t.dst))
                              for t in plan.transfers],
                   device_seconds={new(d): s for d, s in plan.device_seconds.items()},
                   arenas={new(d): a for d, a in plan.arenas.items()})
