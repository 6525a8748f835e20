"""Calibration of models laid out otherwise than one batch axis first: a recurrent state
with its batch on axis 1 (silero's VAD), work inside an If, a Gemm's bias written as a
row by onnxruntime's own pre-processing (Magika)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.graph import load_graph
from runtime.quantize import QuantizeOptions, calibrate, check_samples
from runtime.quantize.data import QuantizeError


def rng() -> np.random.Generator:
    return np.random.default_rng()


def _model(nodes, inputs, weights, outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "layouts", inputs, [
        helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def recurrent(width: int = 8) -> onnx.ModelProto:
    """y = x @ w + sum over layers of state, the state [layers, batch, width] as PyTorch
    lays out an LSTM's; and a scalar gain, the same for every run."""
    f = TensorProto.FLOAT
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]),
         helper.make_node("ReduceSum", ["state", "layers"], ["s"], keepdims=0),
         helper.make_node("Add", ["a", "s"], ["sum"]),
         helper.make_node("Mul", ["sum", "gain"], ["y"])],
        [helper.make_tensor_value_info("x", f, ["batch", width]),
         helper.make_tensor_value_info("state", f, [2, "batch", width]),
         helper.make_tensor_value_info("gain", f, [])],
        {"w": rng().standard_normal((width, width)).astype(np.float32),
         "layers": np.array([0], np.int64)})


def test_a_state_with_its_batch_on_axis_1_calibrates_with_its_samples_there():
    """Its samples were taken along axis 0 (the layers): "different or no sample counts",
    and where another input was a scalar the message itself failed (len() of a scalar)."""
    model, n = recurrent(), 12
    graph = load_graph(model)
    arrays = {"x": rng().standard_normal((n, 8)).astype(np.float32),
              "state": rng().standard_normal((2, n, 8)).astype(np.float32),
              "gain": np.array(0.5, np.float32)}
    samples = check_samples(dict(arrays), graph, "cal.npz")
    assert samples.count == n
    runs = list(samples.batches())
    assert sum(r["x"].shape[0] for r in runs) == n
    assert all(r["state"].shape == (2, r["x"].shape[0], 8) and r["gain"].ndim == 0
               for r in runs)
    np.testing.assert_array_equal(np.concatenate([r["state"] for r in runs], axis=1),
                                  arrays["state"])
    with calibrate(model, samples) as c:
        assert c.tensors > 0
        c.quantize(QuantizeOptions())
    with pytest.raises(QuantizeError, match=r"different or no sample counts \(x: 12, "
                                            r"state: 11\)"):
        check_samples({**arrays, "state": arrays["state"][:, 1:]}, graph, "cal.npz")


def test_work_only_inside_an_if_is_told_its_calibration_ranges_nothing():
    """onnxruntime calibrates the top graph alone: the profile came out empty and was
    called one that "does not belong" to the model."""
    f = TensorProto.FLOAT
    w = rng().standard_normal((4, 4)).astype(np.float32)
    branch = [helper.make_graph([helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"])],
                                f"branch{i}", [], [helper.make_tensor_value_info(f"y{i}", f,
                                                                                 None)])
              for i in range(2)]
    model = _model([helper.make_node("If", ["flag"], ["y"], then_branch=branch[0],
                                     else_branch=branch[1])],
                   [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", f, ["batch", 4])],
                   {"w0": w, "w1": -w})
    samples = check_samples({"flag": np.array(True), "x": rng().standard_normal(
        (8, 4)).astype(np.float32)}, load_graph(model), "cal.npz")
    with pytest.raises(QuantizeError, match="ranged no tensor: the ops it quantizes read no "
                                            "float tensor outside If, Loop and Scan bodies"):
        calibrate(model, samples)


def test_a_gemms_bias_written_as_a_row_quantizes_per_channel():
    """onnxruntime's quantizer checks a per-channel bias one number a channel, and failed
    on a [1, N] row: "The truth value of an array with more than one element"."""
    x = rng().standard_normal((16, 6)).astype(np.float32)
    model = _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                   {"w": rng().standard_normal((6, 5)).astype(np.float32),
                    "b": rng().standard_normal((1, 5)).astype(np.float32)})
    with calibrate(model, check_samples({"x": x}, load_graph(model), "cal.npz")) as c:
        quantized = c.quantize(QuantizeOptions())
    assert any(n.op_type == "DequantizeLinear" for n in quantized.graph.node)
