"""Inputs that name one symbolic dimension must give it one size (ONNX reads one name as
one size): a request whose image batch and feature batch differ is refused before it
runs, on the host, in a batch and in a bundle, and a batch's other members stay right."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.driver import open_bundle
from runtime.errors import InvalidInputError
from runtime.host import HostManager
from tests.support.serving import WAIT


def two_inputs(batch_a: str = "batch", batch_b: str = "batch") -> onnx.ModelProto:
    """y = concat(a @ W, b) along features: both inputs' rows must agree."""
    rng = np.random.default_rng()
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], rng.standard_normal(12).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "W"], ["aw"], name="mm"),
         helper.make_node("Concat", ["aw", "b"], ["y"], axis=1, name="cat")], "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [batch_a, 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [batch_b, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_a, 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def feeds(rng: np.random.Generator, rows_a: int, rows_b: int) -> dict[str, np.ndarray]:
    return {"a": rng.standard_normal((rows_a, 4)).astype(np.float32),
            "b": rng.standard_normal((rows_b, 2)).astype(np.float32)}


def test_a_named_dimension_given_two_sizes_is_refused_even_after_both_were_seen():
    rng = np.random.default_rng()
    model = two_inputs()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("two", model)
        for rows in (1, 3):  # each input's shapes, accepted and remembered
            good = feeds(rng, rows, rows)
            np.testing.assert_allclose(host.run("two", good).result(timeout=WAIT)["y"],
                                       ort.InferenceSession(model.SerializeToString()).run(
                                           None, good)[0], rtol=1e-5)
        with pytest.raises(InvalidInputError) as e:
            host.run("two", feeds(rng, 1, 3))
        assert "'a'" in str(e.value) and "'b'" in str(e.value) and "'batch'" in str(e.value)
        assert "1 and 3" in str(e.value) and "\n" not in str(e.value)


def test_a_batch_refuses_inputs_of_different_rows_and_answers_its_other_members_right():
    """The inputs' batch dimensions have different names, so only the batcher can tell:
    it joins inputs row by row, and a request whose inputs disagree would shift others'."""
    rng = np.random.default_rng()
    model = two_inputs("n", "m")
    session = ort.InferenceSession(model.SerializeToString())
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("two", model, batching={"max_batch_size": 8,
                                                  "max_queue_delay_ms": 50})
        good = [feeds(rng, 1, 1) for _ in range(3)]
        futures = [host.run("two", good[0])]
        with pytest.raises(InvalidInputError, match="different batch sizes"):
            host.run("two", feeds(rng, 1, 2))
        futures += [host.run("two", f) for f in good[1:]]
        with pytest.raises(InvalidInputError, match="different batch sizes"):
            host.run("two", feeds(rng, 2, 1))
        for f, given in zip(futures, good, strict=True):
            np.testing.assert_allclose(f.result(timeout=WAIT)["y"],
                                       session.run(None, given)[0], rtol=1e-5)


def test_a_bundle_refuses_a_named_dimension_given_two_sizes(tmp_path):
    rng = np.random.default_rng()
    path = tmp_path / "two.onnx"
    onnx.save(two_inputs(), path)
    bundle = compile_bundle(path, parse_devices("cpu:1"), tmp_path / "two.prism")
    with open_bundle(bundle.path) as driver:
        assert driver.run(feeds(rng, 2, 2))["y"].shape == (2, 5)
        with pytest.raises(InvalidInputError, match="disagree on dimension 'batch'"):
            driver.run(feeds(rng, 2, 1))
