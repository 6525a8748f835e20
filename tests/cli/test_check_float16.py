"""`--check` on float16: its tolerance follows the narrowest float an output is computed
from (its own dtype, or float16 inside a float32 network), so answers a few float16 ulps
from onnxruntime's pass (the roundings move with the partitions), while float32 and float64
keep theirs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from app.run_cmd import difference, tolerance
from runtime.devices.ort.sessions import supported_ir_version, supported_opset
from tests.cli.test_cli import _wide

__all__ = ["_wide"]  # autouse: rich must not wrap the lines we read

RNG = np.random.default_rng()
WIDTH, LAYERS = 64, 4


def float16_mlp(path: Path, outside: int = TensorProto.FLOAT16) -> str:
    """MatMul, Add and Tanh layers and a Softmax, all on float16; nodes mm0, add0, ...
    `outside` FLOAT: float32 in and out, cast to float16 (cast_in) for the layers and back
    (the last node, cast_out) in place of the Softmax, as an autocast export computes."""
    nodes, weights, x = [], [], "x"
    if outside != TensorProto.FLOAT16:
        nodes.append(helper.make_node("Cast", ["x"], ["xh"], name="cast_in",
                                      to=TensorProto.FLOAT16))
        x = "xh"
    for i in range(LAYERS):
        w = RNG.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)
        weights += [numpy_helper.from_array(w.astype(np.float16), f"w{i}"),
                    numpy_helper.from_array(RNG.standard_normal(WIDTH).astype(np.float16),
                                            f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Tanh", [f"a{i}"], [f"t{i}"], name=f"tanh{i}")]
        x = f"t{i}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], name="softmax")
                 if outside == TensorProto.FLOAT16 else
                 helper.make_node("Cast", [x], ["y"], name="cast_out", to=outside))
    graph = helper.make_graph(
        nodes, "half", [helper.make_tensor_value_info("x", outside, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", outside, ["N", WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", supported_opset())])
    model.ir_version = supported_ir_version()
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.mark.parametrize("outside", [TensorProto.FLOAT16, TensorProto.FLOAT],
                         ids=["float16", "float32-outside"])
def test_check_passes_a_float16_model_split_over_cpu_and_reference(capsys, tmp_path, outside):
    model = float16_mlp(tmp_path / "half.onnx", outside)
    # half the layers on onnxruntime (float16 ops computed in float), half on the
    # reference device (computed in float16), so float16 tensors cross between them
    second = {f"{op}{i}": "reference0" for i in range(LAYERS // 2, LAYERS)
              for op in ("mm", "add", "tanh")}
    last = "softmax" if outside == TensorProto.FLOAT16 else "cast_out"  # the float32
    # output of a float16 computation errs by float16's ulps
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"default": "cpu0", "nodes": {**second, last: "reference0"}}))
    code = main(["run", model, "--devices", "cpu:1,reference:1", "--partition", str(mapping),
                 "--requests", "20", "--concurrency", "2", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^check: every output matches onnxruntime \(20 answers", out,
                     re.MULTILINE), out
    assert re.search(r"^\s*cpu0\s+20\b", out, re.MULTILINE), out  # runs per device
    assert re.search(r"^\s*reference0\s+20\b", out, re.MULTILINE), out


def _ulps(want: np.ndarray, n: int) -> np.ndarray:
    """`want` moved `n` ulps of its own dtype away from zero."""
    out = want.copy()
    for _ in range(n):
        out = np.nextafter(out, np.copysign(np.inf, out))
    return out


def test_check_allows_a_float16_answer_a_few_ulps_off():
    want = RNG.uniform(0.01, 1.0, 256).astype(np.float16)
    assert difference(_ulps(want, 2), want)[1] is None
    assert difference(want * np.float16(1.25), want)[1] is not None  # a real error still fails


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_check_keeps_its_tolerance_for_float32_and_wider(dtype):
    assert tolerance(np.dtype(dtype)) == (1e-4, 1e-5)


def test_check_tolerance_grows_as_the_dtype_narrows():
    rtols = [tolerance(np.dtype(d))[0] for d in (np.float64, np.float32, np.float16)]
    assert rtols == sorted(rtols)
    rtol, atol = tolerance(np.dtype(np.float16))
    assert rtol > np.finfo(np.float16).eps and 0 < atol < rtol
