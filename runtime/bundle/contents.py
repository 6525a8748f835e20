"""The whole network from a bundle, for tools: `prism export-onnx`, the stepper and the
dashboards. It needs onnx and the graph IR, so the driver never imports it.

    export_onnx("gpt2.prism", "plan.onnx")         # every node tagged with its split
    contents = open_contents("gpt2.prism")          # graph, plan, steps, memory plans
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from runtime.bundle.plan_io import plan_from_dict
from runtime.bundle.reader import EXTERNAL_LOCATION, Bundle, read_bundle
from runtime.devices.external import inline_external
from runtime.errors import BundleError, first_line
from runtime.graph import Graph, load_graph
from runtime.partition.plan import Plan
from runtime.partition.steps import Step

NETWORK = "network.onnx"
SINGLE_FILE_LIMIT = 1 << 30  # more weights go beside the model (protobuf stops at 2 GB)


def network_model(bundle: Bundle) -> onnx.ModelProto:
    """The whole network with its weights, each node carrying `prism.partition`,
    `prism.device` and `prism.backend` in its metadata_props."""
    try:
        model = onnx.load_from_string(bundle.member(NETWORK))
    except Exception as exc:
        raise BundleError(f"{bundle.path}: {NETWORK} is not a model: {first_line(exc)}"
                          ) from None
    return inline_external(model, {EXTERNAL_LOCATION: bundle.weights()})


def export_onnx(path: str | Path, out: str | Path) -> onnx.ModelProto:
    """Write the bundle's whole network to `out` as one ONNX file (its weights in a
    `.data` file beside it when they pass SINGLE_FILE_LIMIT)."""
    with read_bundle(path) as bundle:
        model = network_model(bundle)
    out = Path(out)
    big = sum(len(i.raw_data) for i in model.graph.initializer) > SINGLE_FILE_LIMIT
    try:
        onnx.save(model, out, save_as_external_data=big, location=f"{out.name}.data")
    except OSError as exc:
        raise BundleError(f"cannot write {out}: {exc.strerror or exc}") from None
    return model


@dataclass(frozen=True)
class Contents:
    """What a bundle holds beyond what the driver runs."""

    manifest: dict
    graph: Graph
    plan: Plan
    steps: list[Step]
    memory: dict  # device -> its memory plan, as `memory_plans_dict` wrote it


def open_contents(path: str | Path) -> Contents:
    """The graph (nodes named as when it was compiled), the plan, the partitioner's
    steps and the memory plans: what the stepper and the dashboards show."""
    with read_bundle(path) as bundle:
        manifest = bundle.manifest
        graph = load_graph(network_model(bundle), bindings=manifest["bindings"],
                           name=manifest["network"])
        steps = [Step(**{**s, "nodes": tuple(s["nodes"])}) for s in bundle.json("steps.json")]
        return Contents(manifest, graph, plan_from_dict(bundle.json("plan.json")), steps,
                        bundle.json("memory.json"))
