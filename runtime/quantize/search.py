"""`--accuracy-budget`: quantize all it can, then return the fewest nodes to float.

The metric compares a candidate's outputs on held-out samples with the float model's
(lower is better): `top1`, the share of samples whose arg-max class differs (for
classifiers: a 2-D first output); `max-rel`, the largest absolute error over the
largest absolute float value, per output; or a user's `FILE.py:FUNCTION` /
`module:function` taking (reference, candidate), each a dict of output name ->
array with the held-out samples along the first axis, and returning a float.

The search (greedy, then pruned): with everything quantized, if the loss is within
the budget, done. Otherwise each quantized node is tried alone in float (its
sensitivity); nodes go back to float in order of the loss they leave until the
budget holds; then each returned node is tried in int8 again, and stays in int8 if
the budget still holds without it. So no single node of the answer can go back to
int8: a small set, found in (nodes + 2 x returned) quantize-and-run trials.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from runtime.devices.ort.sessions import cpu_session
from runtime.graph import Graph, load_graph
from runtime.machine import usable_cpus
from runtime.precision import DEQUANTIZE_OPS, QUANTIZE_OPS, node_precisions
from runtime.quantize.data import QuantizeError, Samples
from runtime.quantize.quantizer import DEFAULTS, Calibrated, QuantizeOptions, quantizable_ops

Outputs = dict[str, np.ndarray]
Metric = Callable[[Outputs, Outputs], float]
Progress = Callable[[int, int, str], None]  # (done, total, what)


def top1(reference: Outputs, candidate: Outputs) -> float:
    """Share of samples whose arg-max class (first output, last axis) changed."""
    name = next(iter(reference))
    return float(np.mean(reference[name].argmax(-1) != candidate[name].argmax(-1)))


def max_rel(reference: Outputs, candidate: Outputs) -> float:
    """Largest |candidate - reference| over the largest |reference|, worst output."""
    return max(float(np.max(np.abs(candidate[k].astype(np.float64) - r)) /
                     max(float(np.max(np.abs(r))), 1e-12)) for k, r in reference.items())


METRICS: dict[str, Metric] = {"top1": top1, "max-rel": max_rel}


def _is_classifier(graph: Graph) -> bool:
    info = graph.tensors.get(graph.outputs[0])
    if info is None or info.dims is None:
        return False
    dims = info.dims
    return len(dims) == 2 and isinstance(dims[1], int) and dims[1] > 1 and (
        info.dtype or "").startswith("float")


def load_metric(spec: str, graph: Graph) -> tuple[str, Metric]:
    """`auto`, `top1`, `max-rel`, `FILE.py:FUNCTION` or `module:function`."""
    if spec == "auto":
        spec = "top1" if _is_classifier(graph) else "max-rel"
    if spec in METRICS:
        return spec, METRICS[spec]
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise QuantizeError(f"metric {spec!r}: use auto, {', '.join(METRICS)}, "
                            f"FILE.py:FUNCTION or module:function")
    try:
        if where.endswith(".py"):
            loader = importlib.util.spec_from_file_location(Path(where).stem, where)
            if loader is None or loader.loader is None or not Path(where).is_file():
                raise FileNotFoundError(where)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        fn = getattr(module, name)
    except (ImportError, FileNotFoundError, AttributeError, SyntaxError) as exc:
        raise QuantizeError(f"metric {spec!r} cannot be loaded: "
                            f"{type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise QuantizeError(f"metric {spec!r} is not a function")
    return spec, fn


def parse_budget(text: str) -> float:
    """`1%` -> 0.01; a bare number is a fraction (0.01)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise QuantizeError(f"accuracy budget {text!r}: write e.g. 1% or 0.01") from None
    if not 0 <= value < 1:
        raise QuantizeError(f"accuracy budget {text!r} must be at least 0% and under 100%")
    return value


def run_outputs(model: onnx.ModelProto, samples: Samples) -> Outputs:
    """The model's outputs over all samples (plain onnxruntime), concatenated."""
    sess = cpu_session(model, usable_cpus())
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(None, batch) for batch in samples.batches()]
    return {n: np.concatenate([r[i] for r in runs]) for i, n in enumerate(names)}


def quantized_nodes(model: onnx.ModelProto, float_graph: Graph,
                    options: QuantizeOptions) -> list[str]:
    """Nodes of the float graph that compute in int8 in `model`, in model order."""
    if options.format == "qoperator":  # QOperator renames what it quantizes
        ops, kept = quantizable_ops("qoperator"), set(options.float_nodes(float_graph))
        return [n.name for n in float_graph.nodes if n.op_type in ops
                and n.name not in kept and n.op_type not in options.exclude_ops]
    done = node_precisions(load_graph(model))
    return [n.name for n in float_graph.nodes if done.get(n.name) == "int8"
            and n.op_type not in QUANTIZE_OPS | DEQUANTIZE_OPS]


@dataclass
class SearchResult:
    metric: str
    budget: float
    quantized_loss: float  # everything quantized
    loss: float  # the answer's
    kept_float: list[str]
    reasons: dict[str, str]
    model: onnx.ModelProto
    trials: int
    candidates: int
    sensitivity: dict[str, float] = field(default_factory=dict)  # node -> loss alone in float


def search(calibrated: Calibrated, held_out: Samples, budget: float,
           metric: tuple[str, Metric], options: QuantizeOptions = DEFAULTS,
           progress: Progress | None = None) -> SearchResult:
    name, measure = metric
    reference = run_outputs(calibrated.prepared, held_out)
    trials = 0

    def loss_with(float_nodes: list[str]) -> tuple[float, onnx.ModelProto]:
        nonlocal trials
        trials += 1
        model = calibrated.quantize(options.excluding(float_nodes))
        return float(measure(reference, run_outputs(model, held_out))), model

    everything, model = loss_with([])
    graph = load_graph(calibrated.prepared)
    candidates = quantized_nodes(model, graph, options)
    result = SearchResult(name, budget, everything, everything, [], {}, model, trials,
                          len(candidates))
    if everything <= budget:
        return result
    total = len(candidates) * 2
    for i, node in enumerate(candidates):
        if progress:
            progress(i, total, f"sensitivity of {node}")
        result.sensitivity[node] = loss_with([node])[0]
    ranked = sorted(candidates, key=lambda n: (result.sensitivity[n], candidates.index(n)))
    chosen: list[str] = []
    loss = everything
    for node in ranked:
        if progress:
            progress(len(candidates) + len(chosen), total, f"returning {node} to float")
        chosen.append(node)
        loss, model = loss_with(chosen)
        if loss <= budget:
            break
    else:
        raise QuantizeError(f"no set of nodes in float keeps {name} within {budget:.2%}: with "
                            f"all {len(candidates)} quantized nodes in float it is {loss:.2%}")
    missed: dict[str, float] = {}  # node -> the loss with it back in int8
    for node in sorted(chosen, key=lambda n: -result.sensitivity[n]):  # least useful first
        trial = [n for n in chosen if n != node]
        attempt = loss_with(trial) if trial else (everything, result.model)
        if attempt[0] <= budget:
            chosen, (loss, model) = trial, attempt
        else:
            missed[node] = attempt[0]
    for node in chosen:
        result.reasons[node] = (
            f"{graph.node(node).op_type}: {name} {everything:.2%} with every node in int8, "
            f"{result.sensitivity[node]:.2%} with it alone in float; {missed[node]:.2%} (over "
            f"the {budget:.2%} budget) with the others in float but it in int8")
    result.kept_float, result.loss, result.model, result.trials = chosen, loss, model, trials
    if progress:
        progress(total, total, "done")
    return result
