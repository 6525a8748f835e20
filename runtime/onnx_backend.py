"""Prism as an ONNX backend (`onnx.backend.base.Backend`), so ONNX's own test suite runs on it.

    rep = PrismBackend.prepare(model)          # plans, provisions; one HostManager per rep
    outputs = rep.run([x, y])                  # positional (graph input order) or a dict
    rep.close()                                # or let the rep be garbage-collected

By default a rep has two `cpu` devices and a `reference` fallback device. Nodes the cpu
devices cannot run go to the fallback; a model of two or more nodes the cpu devices can
run is split across both of them (balanced mode, or, when balanced keeps everything on
one device, a split of the model order in half), so every run crosses partitions.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from runtime.devices.config import DeviceConfig
from runtime.devices.spec import parse_devices
from runtime.errors import PrismError
from runtime.graph import Graph, load_graph
from runtime.host.manager import HostManager
from runtime.partition import canonical_devices, partition
from runtime.partition.placement import Annotations, place

NETWORK = "model"
_names = itertools.count()


def default_devices() -> list[DeviceConfig]:
    """Two cpu devices and a reference fallback."""
    return [DeviceConfig("cpu0", "cpu"), DeviceConfig("cpu1", "cpu"),
            DeviceConfig("reference0", "reference")]


def _devices(spec: str | Sequence[DeviceConfig] | None) -> list[DeviceConfig]:
    if spec is None:
        return default_devices()
    if isinstance(spec, str):
        return parse_devices(spec)
    return list(spec)


def _fallback(devices: Sequence[DeviceConfig], fallback: str | None) -> str | None:
    """The named fallback, else the first `reference` device when other kinds exist."""
    if fallback is not None:
        return fallback
    refs = [d.name for d in devices if d.backend == "reference"]
    return refs[0] if refs and len(refs) < len(devices) else None


def _annotations(graph: Graph, devices: Sequence[DeviceConfig], fallback: str | None
                 ) -> Annotations:
    """Keep nodes off the fallback unless the other devices cannot run them: with the
    other devices all of one kind, every op is annotated with that kind."""
    main = {d.backend for d in devices if d.name != fallback}
    if fallback is None or len(main) != 1:
        return Annotations(fallback=fallback)
    kind = main.pop()
    return Annotations(ops=dict.fromkeys({n.op_type for n in graph.nodes}, kind),
                       fallback=fallback)


def _halves(graph: Graph, allowed: Mapping[str, frozenset[str]],
            pair: Sequence[str]) -> dict | None:
    """A user map splitting the model order in two: nodes the first device of `pair` can
    run go there up to a cut, the rest to the second; others to any device allowed. Cuts
    whose crossing tensors have unknown types are avoided. None if no split helps."""
    first, second = pair
    both = [n.name for n in graph.nodes if {first, second} <= allowed[n.name]]
    if len(both) < 2:
        return None
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    half = len(both) // 2

    def typed(cut: int) -> bool:  # every tensor crossing the model-order cut has a type
        boundary = index[both[cut]]
        return all(t in graph.types for n in graph.nodes[boundary:] for t in n.reads
                   if (p := graph.producer.get(t)) is not None and index[p] < boundary)

    cuts = sorted(range(1, len(both)), key=lambda c: (abs(c - half), c))
    cut = next((c for c in cuts if typed(c)), half)
    late = set(both[cut:])
    groups: list[tuple[str, list[str]]] = []
    for node in graph.nodes:
        options = allowed[node.name]
        if node.name in late:
            device = second
        elif first in options:
            device = first
        else:
            device = sorted(options)[0]
        if groups and groups[-1][0] == device:
            groups[-1][1].append(node.name)
        else:
            groups.append((device, [node.name]))
    return {"partitions": {f"p{i}": dev for i, (dev, _) in enumerate(groups)},
            "nodes": {n: f"p{i}" for i, (_, names) in enumerate(groups) for n in names}}


def plan_mode(graph: Graph, devices: Sequence[DeviceConfig], annotations: Annotations,
              mode: str = "balanced") -> str | dict:
    """`mode`, or a user map forcing a split when `mode` leaves every node the main devices
    can run on one device."""
    fallback = annotations.fallback
    main = [d for d in canonical_devices(devices) if d.name != fallback]
    if len(main) < 2 or len(graph.nodes) < 2:
        return mode
    plan = partition(graph, devices, mode, annotations=annotations)
    used = {p.device for p in plan.partitions if p.device != fallback}
    if len(used) >= 2:
        return mode
    allowed = place(graph, devices, annotations).allowed
    busy = used.pop() if used else main[0].name
    other = next(d.name for d in main if d.name != busy)
    return _halves(graph, allowed, (busy, other)) or mode


def _as_array(value: Any) -> Any:
    """Feeds as onnxruntime and the reference evaluator take them: arrays, lists of arrays
    (sequences) or None (an empty optional)."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):
        return [_as_array(v) for v in value]
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value)


def _type_outputs(model: onnx.ModelProto) -> None:
    """Outputs declared without a type take the type shape inference gives them."""
    untyped = [o for o in model.graph.output if not o.type.WhichOneof("value")]
    if not untyped:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        raise PrismError(f"cannot infer the output types of {model.graph.node[0].op_type}; "
                         f"pass outputs_info: {' '.join(str(exc).split())}") from None
    kinds = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for out in untyped:
        if out.name in kinds and kinds[out.name].WhichOneof("value"):
            out.type.CopyFrom(kinds[out.name])


class PrismRep(BackendRep):
    """A prepared model on its own HostManager; `run` takes a list, tuple or dict."""

    def __init__(self, model: onnx.ModelProto, devices: Sequence[DeviceConfig], *,
                 partition: str | Mapping = "balanced", fallback: str | None = None,
                 timeout: float | None = None):
        fallback = _fallback(devices, fallback)
        graph = load_graph(model)
        notes = _annotations(graph, devices, fallback)
        mode = plan_mode(graph, devices, notes, partition) if isinstance(partition, str) \
            else partition
        self.timeout = timeout
        self.host = HostManager(devices)
        self._finalizer = weakref.finalize(self, self.host.close)
        try:
            self.plan = self.host.add_network(
                NETWORK, graph, partition=mode,  # the graph loaded here, not loaded again
                annotations={"nodes": dict(notes.nodes), "ops": dict(notes.ops)},
                fallback=fallback)
        except BaseException:
            self.close()
            raise
        self.graph = self.host.graph(NETWORK)
        self.input_names = list(self.graph.inputs)
        self.output_names = list(self.graph.outputs)

    def close(self) -> None:
        """Unload the model and stop the host's devices (also done when garbage-collected)."""
        self._finalizer()

    def __enter__(self) -> PrismRep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return {k: _as_array(v) for k, v in inputs.items()}
        if isinstance(inputs, list | tuple):
            if len(inputs) > len(self.input_names):
                raise PrismError(f"model takes {len(self.input_names)} inputs, "
                                 f"{len(inputs)} given")
            return {n: _as_array(v) for n, v in zip(self.input_names, inputs, strict=False)}
        if len(self.input_names) != 1:
            raise PrismError(f"model takes {len(self.input_names)} inputs; pass a list or dict")
        return {self.input_names[0]: _as_array(inputs)}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        outputs = self.host.run(NETWORK, self.feeds(inputs), waited=True).result(
            kwargs.get("timeout", self.timeout))
        names = self.output_names
        return namedtupledict("Outputs", names)(*[outputs[n] for n in names])


class PrismBackend(Backend):
    """ONNX backend API over Prism. Keyword arguments of `prepare`: `devices` (a spec such
    as "cpu:2,reference" or DeviceConfigs), `fallback` (device name), `partition` (mode or
    user map), `timeout` (seconds per run)."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0].upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> PrismRep:
        if not cls.supports_device(device):
            raise PrismError(f"Prism runs on CPU only, not {device}")
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(
                model)
        return PrismRep(model, _devices(kwargs.get("devices")),
                        partition=kwargs.get("partition", "balanced"),
                        fallback=kwargs.get("fallback"), timeout=kwargs.get("timeout"))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        with cls.prepare(model, device, **kwargs) as rep:
            return rep.run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: a model of that node alone, inputs and outputs typed from the
        arrays given and `outputs_info` (else left for inference)."""
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        arrays = [_as_array(v) for v in (inputs.values() if isinstance(inputs, Mapping)
                                         else inputs)]
        names = [n for n in node.input if n]
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=False)]
        graph_outputs = []
        for i, name in enumerate(n for n in node.output if n):
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                graph_outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(helper.make_empty_tensor_value_info(name))
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        model = helper.make_model(
            helper.make_graph([node], f"node_{next(_names)}", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid(node.domain or "", opset)])
        _type_outputs(model)
        feeds = dict(zip(names, arrays, strict=False))
        return cls.run_model(model, feeds, device, **kwargs)
