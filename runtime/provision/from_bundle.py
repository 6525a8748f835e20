"""Loading a bundle into a host: no partitioning, no re-optimization.

    net = load_bundle("gpt2", "gpt2.prism", host.devices, bus, remap={"cpu3": "cpu7"})

The bundle's devices are matched to the host's by requirement (`match.match_devices`:
kind, memory, ops; `remap` pins one), its plan is rebuilt from `plan.json` and moved onto
the matched devices, and each partition's program is the stored model (optimized at
compile time) with the bundle's `weights.bin` as in-memory external data. Provisioning,
replicas and rollback are the provisioner's own (`network.place_replicas`). The file
stays open, mapped, while the network is loaded: the devices' sessions read their weights
from it.

Light: the host reaches it without the graph IR, onnx or the partitioner; the graph is
loaded from the bundle's `network.onnx` only when someone asks for it (`host.graph`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.bundle.match import match_devices
from runtime.bundle.placed import LoadedBundle
from runtime.bundle.plan_io import plan_from_dict, rename_devices
from runtime.bundle.reader import EXTERNAL_LOCATION, Bundle, read_bundle
from runtime.devices.device import Device, Program
from runtime.errors import BundleError, PrismError, drop_frames, first_line
from runtime.inputs import InputSpec, Signature
from runtime.partition.plan import Plan
from runtime.partition.replicas import further, twin_maps
from runtime.partition.steps import Step
from runtime.provision.network import LoadedNetwork, as_loaded, place_replicas, publish_plan
from runtime.types import BatchingConfig, check_batchable

if TYPE_CHECKING:
    from runtime.graph import Graph

def load_bundle(name: str, path: str | Path, devices: Mapping[str, Device], bus: Any, *,
                remap: Mapping[str, str] | None = None, replicas: int | str | None = None,
                batching: BatchingConfig | None = None, partition: object = None
                ) -> LoadedNetwork:
    """The bundle at `path` loaded as network `name`; BundleError (one line) or a device's
    refusal with nothing left loaded and the file closed. `replicas` and `batching`
    override the bundle's serving settings; `partition`, if given, must be its mode."""
    bundle = read_bundle(path)
    try:
        return _load(name, bundle, devices, bus, remap, replicas, batching, partition)
    except BaseException as exc:
        drop_frames(exc)  # frames holding the mapped weights go first, so the file closes
        bundle.close()
        if isinstance(exc, KeyError | TypeError | ValueError) and not isinstance(
                exc, PrismError):
            raise BundleError(f"{bundle.path}: manifest is malformed: {first_line(exc)}"
                              ) from None
        raise


def _load(name: str, bundle: Bundle, devices: Mapping[str, Device], bus: Any,
          remap: Mapping[str, str] | None, replicas: int | str | None,
          batching: BatchingConfig | None, partition: object) -> LoadedNetwork:
    manifest = bundle.manifest
    if partition is not None and partition != manifest["mode"]:
        raise BundleError(f"{bundle.path} was partitioned ({manifest['mode']}) when it was "
                          f"compiled; recompile it to partition it otherwise")
    configs = [d.config for d in devices.values()]
    try:
        placed = match_devices(manifest, configs, remap)
    except BundleError as exc:
        raise BundleError(f"{bundle.path}: {exc}") from None
    names = {d["name"]: placed[d["partitions"][0]] for d in manifest["devices"]}
    plan = _host_plan(plan_from_dict(bundle.json("plan.json")), names,
                      {d.name: d.config for d in devices.values()})
    serving = BatchingConfig.of(manifest["batching"]) if batching is None else batching
    if batching is not None and batching != BatchingConfig.of(manifest["batching"]):
        outputs = manifest.get("output_dims") or dict.fromkeys(manifest["outputs"])
        check_batchable(manifest["network"], {i["name"]: i["dims"] for i in manifest["inputs"]},
                        outputs)
    copies = manifest["replicas"] if replicas is None else replicas
    twin_sets: list[Mapping[str, str] | None] = [None]
    if copies != 1:
        twin_sets += twin_maps(plan, configs, further(copies))
    if bus.active:
        steps = [Step(**{**s, "nodes": tuple(s["nodes"]), "device": names.get(
            s["device"], s["device"])}) for s in bundle.json("steps.json")]
        publish_plan(bus, name, steps, plan)
    face = Signature([InputSpec.from_dict(i) for i in manifest["inputs"]],
                     tuple(manifest["outputs"]), bundle.constants())
    loaded, executors = place_replicas(name, plan, _programs(bundle, plan, name), devices,
                                       bus, twin_sets, face)
    origin = LoadedBundle(bundle.path, bundle, manifest, names)
    return LoadedNetwork(name, as_loaded(plan, loaded[0], devices), face, loaded, executors,
                         serving,
                         graph_source=lambda: bundle_graph(origin, name), bundle=origin)


def bundle_graph(origin: LoadedBundle, name: str) -> Graph:
    """The whole network's graph, from the bundle's network.onnx: onnx and the graph IR
    load here, only when someone asks for the graph."""
    from runtime.bundle.contents import network_model
    from runtime.graph import load_graph

    return load_graph(network_model(origin.file), bindings=origin.manifest["bindings"],
                      name=name)


def _host_plan(plan: Plan, names: Mapping[str, str], configs: Mapping[str, Any]) -> Plan:
    """The bundle's plan on this host's devices (those it uses, with the host's figures)."""
    moved = rename_devices(plan, names, configs)
    used = set(names.values())
    return replace(moved, devices=[d for d in moved.devices if d.name in used],
                   device_seconds={d: s for d, s in moved.device_seconds.items() if d in used})


def _programs(bundle: Bundle, plan: Plan, network: str) -> dict[str, Program]:
    """partition -> its program: the stored model, the bundle's weights in memory, the op
    types the partition had before optimization (what device op lists name), its weights,
    its device's arena and its stage time."""
    rows = {r["partition"]: r for r in bundle.manifest["schedule"]}
    ops = {r["partition"]: frozenset(r["ops"]) for r in bundle.manifest["requirements"]}
    made = {p.name: Program(bundle.member(rows[p.name]["model"]), ops[p.name], p.weight_bytes,
                            plan.arenas.get(p.device, 0), p.stage_seconds,
                            f"{network}/{p.name}", half=rows[p.name].get("half", False))
            for p in plan.partitions}
    external = {EXTERNAL_LOCATION: bundle.weights()}  # taken last: nothing above can fail
    return {name: replace(program, external=external) for name, program in made.items()}
