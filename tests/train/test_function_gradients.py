"""Ops onnx defines as functions, with no rule of their own, train as their bodies
(runtime/train/expand.py): against central differences in float64 where the body
computes in float64, against PyTorch's autograd in float32 where onnx writes the body in
float32 (Celu, MeanVarianceNormalization) or onnxruntime's float64 kernel computes in
float32 (Shrink, which the central differences run on)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import defs

from runtime.errors import TrainingError
from runtime.train import gradients
from runtime.train.forward import TRAINING_OPSET
from tests.support.gradcheck import mismatches, numeric_gradients
from tests.train.test_gradient_rules import Check, Rng, node_check, normal, positive, shape_of


def function_opset(op: str) -> int:
    """The first opset at which onnx gives `op` a function body, or TRAINING_OPSET."""
    schema = defs.get_schema(op)
    versions = [*schema.function_opset_versions, *schema.context_dependent_function_opset_versions]
    return max(TRAINING_OPSET, min(versions))


def selu_case(rng: Rng) -> Check:
    """At TRAINING_OPSET, before Selu's first body (18), whose ops mean the same there."""
    return node_check(rng, "Selu", {"x": normal(rng, *shape_of(rng))},
                      {"alpha": float(rng.uniform(1, 2)), "gamma": float(rng.uniform(0.5, 1.5))},
                      opset=TRAINING_OPSET)


def thresholded_relu_case(rng: Rng) -> Check:
    x = normal(rng, *shape_of(rng))
    alpha = float(rng.uniform(0.1, 0.5))
    x = np.where(np.abs(x - alpha) < 0.01, x + 0.05, x)  # off the step
    return node_check(rng, "ThresholdedRelu", {"x": x}, {"alpha": alpha}, opset=TRAINING_OPSET)


def reduce_case(op: str, operand: Callable[..., np.ndarray]) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        shape = shape_of(rng, low=2)
        axes = sorted(rng.choice(len(shape), int(rng.integers(1, len(shape) + 1)),
                                 replace=False).tolist())
        return node_check(rng, op, {"x": operand(rng, *shape),
                                    "axes": np.asarray(axes, np.int64)},
                          {"keepdims": int(rng.integers(0, 2))}, opset=function_opset(op))
    return make


def swish_case(rng: Rng) -> Check:
    return node_check(rng, "Swish", {"x": normal(rng, *shape_of(rng))},
                      {"alpha": float(rng.uniform(0.5, 2))}, opset=function_opset("Swish"))


def group_normalization_case(rng: Rng) -> Check:
    groups, per, n = (int(v) for v in rng.integers(1, 4, 3))
    c = groups * per
    return node_check(rng, "GroupNormalization",
                      {"x": normal(rng, n, c, *shape_of(rng, 2, low=2)), "s": normal(rng, c),
                       "b": normal(rng, c)},
                      {"num_groups": groups, "stash_type": onnx.TensorProto.DOUBLE},
                      opset=function_opset("GroupNormalization"))


def rms_normalization_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3, low=2)
    axis = int(rng.integers(-2, 0))
    return node_check(rng, "RMSNormalization", {"x": normal(rng, *shape),
                                                "s": normal(rng, *shape[axis:])},
                      {"axis": axis, "stash_type": onnx.TensorProto.DOUBLE},
                      opset=function_opset("RMSNormalization"))


def attention_case(rng: Rng) -> Check:
    b, h, q, k, d = (int(v) for v in rng.integers(1, 4, 5))
    return node_check(rng, "Attention", {"q": normal(rng, b, h, q, d), "k": normal(rng, b, h, k, d),
                                         "v": normal(rng, b, h, k, d)},
                      {"is_causal": int(rng.integers(0, 2))}, opset=function_opset("Attention"))


def rotary_embedding_case(rng: Rng) -> Check:
    b, h, s = (int(v) for v in rng.integers(1, 4, 3))
    half = int(rng.integers(1, 3))
    positions = rng.integers(0, s, (b, s)).astype(np.int64)
    return node_check(rng, "RotaryEmbedding",
                      {"x": normal(rng, b, h, s, 2 * half), "cos": normal(rng, s, half),
                       "sin": normal(rng, s, half)},
                      {"interleaved": int(rng.integers(0, 2))}, inputs={"p": positions},
                      order=["x", "cos", "sin", "p"], opset=function_opset("RotaryEmbedding"))


def nll_case(rng: Rng) -> Check:
    n, c = (int(v) for v in rng.integers(2, 5, 2))
    return node_check(rng, "NegativeLogLikelihoodLoss",
                      {"x": normal(rng, n, c), "w": positive(rng, c)},
                      {"reduction": str(rng.choice(["none", "sum", "mean"]))},
                      inputs={"t": rng.integers(0, c, n).astype(np.int64)},
                      order=["x", "t", "w"], opset=function_opset("NegativeLogLikelihoodLoss"))


CASES: dict[str, Callable[[Rng], Check]] = {
    "Selu": selu_case, "ThresholdedRelu": thresholded_relu_case,
    "ReduceLogSum": reduce_case("ReduceLogSum", positive), "Swish": swish_case,
    "GroupNormalization": group_normalization_case,
    "RMSNormalization": rms_normalization_case, "Attention": attention_case,
    "RotaryEmbedding": rotary_embedding_case, "NegativeLogLikelihoodLoss": nll_case,
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_a_function_trains_as_its_body(op: str) -> None:
    rng = np.random.default_rng()
    for _ in range(3):
        check = CASES[op](rng)
        analytic = gradients(check.model, check.feeds, check.target, loss="mse")
        numeric = numeric_gradients(check.model, check.feeds, check.target, "mse")
        assert not mismatches(analytic, numeric), (op, onnx.printer.to_text(check.model.graph),
                                                   mismatches(analytic, numeric))


@pytest.mark.parametrize("op", ["Celu", "Shrink", "MeanVarianceNormalization"])
def test_a_float32_function_matches_pytorch_autograd(op: str) -> None:
    """Celu's and MeanVarianceNormalization's bodies are written at an older opset than
    the model's, and go through onnx's version converter."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    alpha, lambd, bias = (float(v) for v in rng.uniform(0.2, 1.5, 3))
    attrs = {"Celu": {"alpha": alpha}, "Shrink": {"lambd": lambd, "bias": bias},
             "MeanVarianceNormalization": {"axes": [0, 2]}}[op]
    value = rng.standard_normal((3, 4, 5)).astype(np.float32)
    check = node_check(rng, op, {"x": value}, attrs)
    ours = gradients(check.model, check.feeds, check.target, loss="mse")["x"]
    x = torch.tensor(value, requires_grad=True)
    if op == "Celu":
        y = torch.nn.functional.celu(x, alpha)
    elif op == "Shrink":
        y = torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, 0 * x))
    else:
        mean = x.mean((0, 2), keepdim=True)
        y = (x - mean) / (torch.sqrt((x * x).mean((0, 2), keepdim=True) - mean ** 2) + 1e-9)
    torch.nn.functional.mse_loss(y, torch.tensor(check.target, dtype=torch.float32)).backward()
    np.testing.assert_allclose(ours, x.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_function_whose_body_holds_a_subgraph_is_refused() -> None:
    """AffineGrid's body branches with an If, which has no rule: one line naming it."""
    rng = np.random.default_rng()
    check = node_check(rng, "AffineGrid", {"theta": normal(rng, 2, 2, 3),
                                           "size": np.asarray([2, 1, 3, 4], np.int64)},
                       opset=function_opset("AffineGrid"))
    with pytest.raises(TrainingError, match=r"affinegrid \(AffineGrid\) has no gradient rule"):
        gradients(check.model, check.feeds, check.target, loss="mse")
