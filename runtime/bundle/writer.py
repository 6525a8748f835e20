"""Compiling a model into a bundle: partition once, extract and optimize each partition,
store every distinct weight once, write the tables a run reads. docs/bundle-format.md
describes the file.

    compile_bundle("gpt2.onnx", parse_devices("cpu:4"), "gpt2.prism", partition="balanced")
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from runtime.bundle.driver import RUNS_IN_ORT, load_stage
from runtime.bundle.reader import (
    EXTERNAL_LOCATION,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    REQUEST_MEMORY,
    WEIGHTS,
    read_bundle,
)
from runtime.devices.config import DeviceConfig
from runtime.devices.external import pointed
from runtime.devices.ort.options import session_options
from runtime.devices.ort.sessions import stamped, supported_ir_version
from runtime.errors import BundleError, first_line
from runtime.graph import Graph, holds_half, load_graph
from runtime.inputs import bound_to_feeds, input_specs
from runtime.partition.liveness import request_memory
from runtime.partition.measure import Feeds
from runtime.partition.memory_plan import memory_plans, memory_plans_dict
from runtime.partition.plan import Plan
from runtime.partition.planning import plan_network
from runtime.partition.steps import Step
from runtime.partition.submodel import extract
from runtime.stored import values, with_weights
from runtime.types import BatchingConfig, check_batchable
from runtime.versions import versions

# Initializers this size and up go to weights.bin; smaller ones (shape vectors, axes)
# stay in their sub-model, since onnxruntime reads those while inferring shapes at load
# and cannot from in-memory external data. onnxruntime's own default for its optimized
# models' external initializers.
EXTERNAL_MIN_BYTES = 1024
ALIGN = 64  # bytes: weights.bin starts, and each tensor in it starts, on this boundary
NODE_METADATA_IR = 10  # the IR version that gave nodes metadata_props
OPTIMIZED = {"cpu": "extended", "sim": "extended", "ray": "extended", "reference": "none"}
_EPOCH = (1980, 1, 1, 0, 0, 0)  # a fixed member date: the same input gives the same bytes
Progress = Callable[[str, int, int], None]  # (what, done, total; 0 = unknown)


class WeightStore:
    """weights.bin: each distinct tensor's bytes once, aligned, found by content."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self.at: dict[bytes, int] = {}
        self.referenced = 0  # bytes asked for, counting every repeat

    def put(self, data: bytes) -> int:
        self.referenced += len(data)
        key = hashlib.sha256(data).digest()
        if key not in self.at:
            self.blob.extend(bytes(-len(self.blob) % ALIGN))
            self.at[key] = len(self.blob)
            self.blob.extend(data)
        return self.at[key]


def externalize(model: onnx.ModelProto, store: WeightStore) -> onnx.ModelProto:
    """Move each initializer of EXTERNAL_MIN_BYTES or more held as raw bytes into `store`;
    the model names it as external data in weights.bin (offset, length), as ONNX does."""
    for init in model.graph.initializer:
        if (len(init.raw_data) < EXTERNAL_MIN_BYTES
                or init.data_location == onnx.TensorProto.EXTERNAL):
            continue
        offset, length = store.put(init.raw_data), len(init.raw_data)
        init.ClearField("raw_data")
        pointed(init, EXTERNAL_LOCATION, offset, length)
    return model


def optimize(model: onnx.ModelProto, threads: int, half: bool, label: str
             ) -> onnx.ModelProto | None:
    """onnxruntime's extended-level optimized model (fusions, constant folding): what
    every machine runs alike. The layout passes (NCHWc, by the CPU's vector width) are
    left to load time on the machine that runs it. None where onnxruntime cannot read
    back what it wrote: 1.32 names the Split a fusion makes in a Loop's body as it named
    one before the Loop (`split_output`), which its loader refuses as not single
    assignment (torchvision's Mask R-CNN); the model is then optimized as it loads."""
    opts = session_options(threads, half=half)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory(prefix="prism-") as tmp:
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BundleError(f"{label}: onnxruntime cannot optimize it: "
                              f"{first_line(exc)}") from None
        try:
            ort.InferenceSession(opts.optimized_model_filepath,
                                 session_options(threads, half=half, optimized=False),
                                 providers=["CPUExecutionProvider"])
        except Exception:
            return None
        return onnx.load(opts.optimized_model_filepath)


def annotated_network(graph: Graph, plan: Plan) -> onnx.ModelProto:
    """The whole model, stamped for onnxruntime, each node carrying its partition, device
    and backend in metadata_props (what Netron shows as the split)."""
    model = stamped(with_weights(graph.model))
    model.ir_version = max(model.ir_version, min(NODE_METADATA_IR, supported_ir_version()))
    home = {n: p for p in plan.partitions for n in p.nodes}
    for node in model.graph.node:
        part = home[node.name]
        for key, value in (("partition", part.name), ("device", part.device),
                           ("backend", part.backend)):
            node.metadata_props.add(key=f"prism.{key}", value=value)
    model.metadata_props.add(key="prism.plan", value=f"{plan.mode}, {len(plan.partitions)} "
                                                     f"partitions")
    return model


def _constants(graph: Graph, store: WeightStore) -> dict[str, dict]:
    """Graph outputs that are initializers: the driver returns them as they are."""
    out = {}
    for name in graph.outputs:
        if name in graph.initializers:
            array = values(graph.initializers[name])
            data = array.tobytes()
            out[name] = {"dtype": array.dtype.name, "shape": list(array.shape),
                         "offset": store.put(data), "length": len(data)}
    return out


def _tables(graph: Graph, plan: Plan) -> tuple[list[dict], list[dict], list[dict]]:
    """The schedule table, the partitions' requirements and the devices' needs."""
    writes = {p.name: list(p.outputs) or [t for n in p.nodes for t in graph.node(n).writes]
              for p in plan.partitions}
    made_by = {t: name for name, ts in writes.items() for t in ts}
    config = {d.name: d for d in plan.devices}
    schedule, requirements = [], []
    for p in plan.partitions:
        after = list(dict.fromkeys(made_by[t] for t in p.inputs if t in made_by))
        schedule.append({
            "partition": p.name, "device": p.device, "backend": p.backend,
            "threads": config[p.device].threads if p.backend in ("cpu", "ray") else 1,
            "spin": config[p.device].spin,
            "model": f"partitions/{p.name}.onnx", "optimization": OPTIMIZED[p.backend],
            "reads": list(p.inputs), "writes": writes[p.name], "after": after})
        requirements.append({
            "partition": p.name, "device": p.device, "kind": p.backend,
            "weight_bytes": p.weight_bytes, "activation_bytes": p.activation_bytes,
            "ops": sorted({graph.node(n).op_type for n in p.nodes})})
    need = plan.device_memory()
    used = list(dict.fromkeys(p.device for p in plan.partitions))
    devices = [{"name": d, "kind": config[d].backend, "threads": config[d].threads,
                "memory_bytes": need[d], "arena_bytes": plan.arenas.get(d, 0),
                "partitions": [p.name for p in plan.partitions if p.device == d]}
               for d in used]
    return schedule, requirements, devices


def _member(name: str) -> zipfile.ZipInfo:
    return zipfile.ZipInfo(name, date_time=_EPOCH)


def _write_zip(path: str, members: list[tuple[str, bytes]], weights: bytes) -> None:
    """Every member stored uncompressed; weights.bin last, its bytes starting on ALIGN
    (padding in its local header's extra field, as Android's zipalign does)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members:
            archive.writestr(_member(name), data)
        info = _member(WEIGHTS)
        assert archive.fp is not None  # open for writing
        start = archive.fp.tell() + 30 + len(WEIGHTS) + 4
        pad = -start % ALIGN
        info.extra = struct.pack("<HH", 0xD935, pad) + bytes(pad)
        archive.writestr(info, weights)


def _check_loads(path: Path) -> None:
    """Open the written bundle as the driver does and load every partition it runs (a
    `reference` partition is the extracted model the evaluator reads, nothing new), so
    a bundle that would not load is never written; the error names the partition."""
    with read_bundle(path) as bundle:
        for i, row in enumerate(bundle.manifest["schedule"]):
            if row["backend"] in RUNS_IN_ORT:
                load_stage(bundle, i, row)


@dataclass(frozen=True)
class Compiled:
    """What `compile_bundle` made: the file, its manifest and its plan."""

    path: Path
    manifest: dict
    plan: Plan
    size: int


def write_bundle(path: str | Path, graph: Graph, plan: Plan, steps: Sequence[Step], *,
                 source: str = "", options: Mapping | None = None,
                 on_progress: Progress | None = None) -> Compiled:
    """Write `plan` of `graph` as a bundle at `path` (atomically), then open it once with
    the driver to prove every partition loads. `options` are the serving settings a host
    applies at load (replicas, batching)."""
    report = on_progress or (lambda what, done, total: None)
    store = WeightStore()
    members: list[tuple[str, bytes]] = []
    schedule, requirements, devices = _tables(graph, plan)
    for i, (part, row) in enumerate(zip(plan.partitions, schedule, strict=True)):
        report(f"compiling {part.name} for {part.device}", i, len(plan.partitions))
        model = with_weights(extract(graph, part))  # its weights copied into the bundle
        row["half"] = holds_half(model)  # the driver makes its sessions as `cpu` does
        if row["optimization"] != "none":
            optimized = optimize(model, row["threads"], row["half"],
                                 f"{graph.name}/{part.name} on {part.device}")
            if optimized is None:
                row["optimization"] = "none"  # stored as extracted, optimized as it loads
            else:
                model = optimized
        members.append((row["model"], externalize(model, store).SerializeToString()))
    report("writing", len(plan.partitions), len(plan.partitions))
    network = externalize(annotated_network(graph, plan), store)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "network": graph.name,
        "created_with": versions(("onnx", "onnxruntime", "numpy")), "source": source,
        "mode": plan.mode, "bindings": graph.bindings, **dict(options or {}),
        "inputs": [s.to_dict() for s in input_specs(graph)], "outputs": list(graph.outputs),
        "output_dims": {n: None if d is None else list(d)
                        for n, d in graph.declared_dims(graph.outputs).items()},
        "constants": _constants(graph, store), "schedule": schedule,
        "requirements": requirements, "devices": devices,
        "weights": {"bytes": len(store.blob), "tensors": len(store.at),
                    "referenced_bytes": store.referenced},
    }
    text = [(MANIFEST, manifest), ("plan.json", plan.to_dict()),
            ("memory.json", memory_plans_dict(memory_plans(plan, graph))),
            ("steps.json", [s.to_dict() for s in steps])]
    # any limit: the machine serving it says its own (`RequestMemory.from_dict`)
    needs = request_memory(graph, [p.nodes for p in plan.partitions], limit=1)
    if needs is not None:
        text.append((REQUEST_MEMORY, needs.to_dict()))
    members = [(name, json.dumps(data, indent=1).encode()) for name, data in text] + [
        ("network.onnx", network.SerializeToString()), *members]
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_zip(str(tmp), members, bytes(store.blob))
        _check_loads(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise BundleError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return Compiled(path, manifest, plan, path.stat().st_size)


def compile_bundle(model: str | Path | onnx.ModelProto | Graph,
                   devices: Sequence[DeviceConfig], out: str | Path, *,
                   partition: str | Mapping = "balanced", annotations=None,
                   fallback: str | None = None, replicas: int | str = 1,
                   batching: Mapping | None = None, bindings: Mapping[str, int] | None = None,
                   name: str | None = None, on_progress: Progress | None = None,
                   costs: str | None = None, sample_feeds: Feeds | None = None) -> Compiled:
    """Load, partition and write `model` as a bundle at `out`; see `write_bundle`.
    `costs` and `sample_feeds`: as for `HostManager.add_network` (default measured, on
    made-up values)."""
    report = on_progress or (lambda what, done, total: None)
    report("loading", 0, 0)
    label = name or (Path(model).stem if isinstance(model, str | Path) else None)
    graph = load_graph(model, bindings=bindings, name=label)
    if sample_feeds is not None:
        graph, sample_feeds = bound_to_feeds(graph, sample_feeds, bindings)
    config = BatchingConfig.of(batching)
    if config is not None:
        check_batchable(graph.name, graph.declared_dims(graph.inputs),
                        graph.declared_dims(graph.outputs))

    def seen(step: Step) -> None:
        if step.index % 64 == 0:
            report("partitioning", step.index, 0)

    steps, plan = plan_network(graph, devices, partition, annotations=annotations,
                               fallback=fallback, replicas=replicas, on_step=seen,
                               costs=costs, on_progress=report, sample_feeds=sample_feeds)
    options = {"replicas": replicas,
               "batching": None if config is None else {
                   "max_batch_size": config.max_batch_size,
                   "max_queue_delay_ms": config.max_queue_delay_ms,
                   "preferred_batch_sizes": list(config.preferred_batch_sizes)}}
    return write_bundle(out, graph, plan, steps, source=str(model) if isinstance(
        model, str | Path) else "", options=options, on_progress=on_progress)
