"""`raise_opset`: a model raised by onnx's version converter answers as before. Before
opset 11, Upsample and Resize map pixels asymmetrically; the converter's Resize, read at
a later opset, maps half-pixel centres, unless told."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.opset_raise import raise_opset

# (op, opset, shrinks): Upsample-7 holds its scales as an attribute, the later ones as an
# input; Upsample only grows
OLD_FORMS = [("Upsample", 7, False), ("Upsample", 9, False), ("Resize", 10, False),
             ("Resize", 10, True)]


def resize_model(op: str, opset: int, mode: str, scales: list[float]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    if opset < 9:
        node, weights = helper.make_node(op, ["x"], ["y"], mode=mode, scales=scales), []
    else:
        node = helper.make_node(op, ["x", "scales"], ["y"], mode=mode)
        weights = [numpy_helper.from_array(np.asarray(scales, np.float32), "scales")]
    graph = helper.make_graph([node], "resize", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=7)


def answer(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize(("op", "opset", "shrink"), OLD_FORMS)
def test_an_older_resize_raised_answers_as_before(op: str, opset: int, shrink: bool,
                                                  mode: str) -> None:
    rng = np.random.default_rng()
    # off the whole numbers, where nearest pixels of the two mappings part
    sides = rng.uniform(0.3, 0.95, 2) if shrink else rng.uniform(1.1, 3.5, 2)
    model = resize_model(op, opset, mode, [1.0, 1.0, *map(float, sides.round(2))])
    x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    raised = raise_opset(model, 17)
    assert raised.opset_import[0].version == 17
    np.testing.assert_allclose(answer(raised, x), answer(model, x), rtol=0, atol=1e-6)


def test_a_resize_at_opset_11_keeps_its_own_mapping() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 7])
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear")
    settings = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
                numpy_helper.from_array(np.asarray([1, 1, 2.5, 1.5], np.float32), "scales")]
    model = helper.make_model(
        helper.make_graph([node], "resize", [x], [onnx.ValueInfoProto(name="y")], settings),
        opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    raised = raise_opset(model, 17)
    [resize] = raised.graph.node
    assert all(a.name != "coordinate_transformation_mode" for a in resize.attribute)
    x = np.random.default_rng().standard_normal((1, 2, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(answer(raised, x), answer(model, x), rtol=0, atol=1e-6)
