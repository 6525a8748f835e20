"""Gradient checks: central differences in float64, compared as PyTorch's `gradcheck`
compares (elementwise |analytic - numeric| <= atol + rtol * |numeric|, eps 1e-6,
atol 1e-5, rtol 1e-3).

The numeric side never touches Prism's training code: the model runs forward as given
(onnxruntime, or onnx's reference evaluator where onnxruntime lacks a float64 kernel,
with the `reference` backend's kernels where the evaluator's own are wrong)
with its initializers turned into inputs, and the loss is computed here in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

from runtime.devices.reference_ops import KERNELS

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3  # torch.autograd.gradcheck's defaults
KINK_NARROWING = 1000  # float64's rounding at 1e-9: 1e-7 of the loss


class Erf(OpRun):
    """Erf in float64 (the reference evaluator's own computes in float32, too coarse for
    central differences; its Gelu is a function of Erf and so takes this one too)."""

    def _run(self, x):
        return (_erf(x),)


class Gelu(OpRun):
    """Gelu in float64 (the evaluator's own is a function of its float32 Erf)."""

    def _run(self, x, approximate="none"):
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
            return (0.5 * x * (1 + np.tanh(inner)),)
        return (0.5 * x * (1 + _erf(x / math.sqrt(2))),)


def float64_evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[Erf, Gelu, *KERNELS])


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """F.cross_entropy: mean over every position of -log softmax at the label."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    picked = np.take_along_axis(logp, np.expand_dims(labels.astype(np.int64), 1), axis=1)
    return float(-picked.mean())


def mse(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(np.mean((prediction - target) ** 2))


LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "cross_entropy": cross_entropy, "mse": mse}


def forward_runner(model: onnx.ModelProto) -> tuple[Callable[[dict], np.ndarray], list[str]]:
    """A function of (feeds with the weights) -> the first output, and the weights' names.
    The model runs as trained: BatchNormalization in training mode (batch statistics),
    Dropout as in inference."""
    weights = [t.name for t in model.graph.initializer
               if numpy_helper.to_array(t).dtype.kind == "f"]
    open_model = onnx.ModelProto()
    open_model.CopyFrom(model)
    for node in open_model.graph.node:
        if node.op_type == "Dropout":
            del node.input[1:]  # no ratio, no training mode: as in inference
        if node.op_type == "BatchNormalization":
            kept = [a for a in node.attribute if a.name != "training_mode"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
    kept = [t for t in open_model.graph.initializer if t.name not in weights]
    inputs = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
              for t in open_model.graph.initializer if t.name in weights]
    del open_model.graph.initializer[:]
    open_model.graph.initializer.extend(kept)
    open_model.graph.input.extend(inputs)
    first = open_model.graph.output[0].name
    evaluator = float64_evaluator(open_model)
    session: ort.InferenceSession | None
    try:
        session = ort.InferenceSession(open_model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
    except Exception:
        session = None

    def run(feeds: dict) -> np.ndarray:
        nonlocal session
        if session is not None:
            try:
                return session.run([first], feeds)[0]
            except RuntimeException:  # a kernel that runs none of its types (float64 LSTM)
                session = None
        return evaluator.run([first], feeds)[0]

    return run, weights


def numeric_gradients(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                      labels: np.ndarray, loss: str, eps: float = EPS) -> dict[str, np.ndarray]:
    """Central differences; where the slopes either side disagree (a Relu or a MaxPool's
    choice turned within `eps` of the weights: a fresh cnn's check once failed so), the
    difference is taken again `KINK_NARROWING` times closer, where no kink lies."""
    run, names = forward_runner(model)
    values = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer
              if t.name in names}
    loss_of = LOSSES[loss]

    def at() -> float:
        return loss_of(run({**feeds, **values}), labels)

    here = at()
    grads = {}
    for name in names:
        w = values[name]
        grad = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            keep, step = w[i], eps
            while True:
                w[i] = keep + step
                up = at()
                w[i] = keep - step
                down = at()
                w[i] = keep
                grad[i] = (up - down) / (2 * step)
                sides = abs((up - here) - (here - down)) / step
                if step < eps or sides <= ATOL + RTOL * abs(grad[i]):
                    break
                step = eps / KINK_NARROWING
        grads[name] = grad
    return grads


def mismatches(analytic: Mapping[str, np.ndarray], numeric: Mapping[str, np.ndarray],
               atol: float = ATOL, rtol: float = RTOL) -> list[str]:
    """One line per initializer whose gradients differ beyond gradcheck's tolerance."""
    out = []
    assert set(analytic) == set(numeric), (sorted(analytic), sorted(numeric))
    for name, want in numeric.items():
        got = analytic[name]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        bad = np.abs(got - want) > atol + rtol * np.abs(want)
        if bad.any():
            i = np.unravel_index(np.argmax(np.abs(got - want)), want.shape)
            out.append(f"{name}: {bad.sum()} of {bad.size} differ, worst at {i}: "
                       f"analytic {got[i]:.8g} numeric {want[i]:.8g}")
    return out


def typed_model(nodes: list[onnx.NodeProto], weights: Mapping[str, np.ndarray],
                outputs: list[str], inputs: Mapping[str, np.ndarray] | None = None,
                opset: int = 17) -> onnx.ModelProto:
    """A model of `nodes` with `weights` as initializers and `inputs` as graph inputs, its
    outputs typed and shaped as one run makes them (onnxruntime, else onnx's reference
    evaluator)."""
    inputs = dict(inputs or {})

    def build(outs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes, "check",
            [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                           list(v.shape)) for k, v in inputs.items()],
            outs, [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                 ir_version=9)

    loose = build([onnx.ValueInfoProto(name=o) for o in outputs])
    try:
        session = ort.InferenceSession(loose.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        values = session.run(outputs, dict(inputs))
    except Exception:
        values = float64_evaluator(loose).run(outputs, dict(inputs))
    return build([helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(v.dtype),
                                                list(np.shape(v)))
                  for o, v in zip(outputs, values, strict=True)])
