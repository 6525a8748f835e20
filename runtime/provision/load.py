"""One way in for a network: an ONNX model is planned and extracted now (`from_model`), a
bundle compiled ahead of time is read as it was placed (`from_bundle`). The graph IR, onnx
and the partitioner load only for a model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.bundle.reader import is_bundle
from runtime.devices.device import Device
from runtime.errors import PrismError
from runtime.provision.from_bundle import load_bundle
from runtime.provision.network import LoadedNetwork
from runtime.types import BatchingConfig

if TYPE_CHECKING:
    from runtime.partition.measure import Feeds
    from runtime.partition.planning import CostsSpec, PartitionSpec
    from runtime.provision.from_model import ModelSource


def load(name: str, model: ModelSource, devices: Mapping[str, Device], bus: Any, *,
         partition: PartitionSpec | None, annotations: str | Path | Mapping | None,
         fallback: str | None, replicas: int | str | None, batching: BatchingConfig | None,
         bindings: Mapping[str, int] | None, remap: Mapping[str, str] | None,
         costs: CostsSpec | None = None, sample_feeds: Feeds | None = None) -> LoadedNetwork:
    """The network, loaded onto `devices`; raises with nothing left loaded."""
    if is_bundle(model):
        assert isinstance(model, str | Path)
        fixed = {"annotations": annotations, "fallback": fallback, "bindings": bindings,
                 "costs": costs, "sample_feeds": sample_feeds}
        given = [k for k, v in fixed.items() if v is not None]
        if given:
            raise PrismError(f"{model} is a bundle, placed when it was compiled: "
                             f"{', '.join(given)} cannot change it (recompile it)")
        return load_bundle(name, model, devices, bus, remap=remap, replicas=replicas,
                           batching=batching, partition=partition)
    if remap:
        raise PrismError("remap applies to bundles (NAME.prism); a model is planned onto "
                         "the host's devices as they are named")
    from runtime.graph import load_graph
    from runtime.provision.from_model import load_network

    if isinstance(model, str | Path):  # its size checked against free memory unread
        model = load_graph(model, bindings=bindings, name=name,
                           max_bytes=sum(d.free_bytes for d in devices.values()))
    return load_network(name, model, devices, bus, partition=partition or "balanced",
                        annotations=annotations, fallback=fallback,
                        replicas=1 if replicas is None else replicas, batching=batching,
                        bindings=bindings, costs=costs, sample_feeds=sample_feeds)
