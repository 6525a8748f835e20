"""`runtime.train.gradients` on whole models: against central differences in float64
(gradcheck's tolerances), float32 against float64, every device kind running the backward
graph, PyTorch's autograd when torch is installed, and the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from runtime.errors import InvalidInputError, TrainingError
from runtime.graph import load_graph
from runtime.train import gradients, loss_and_gradients
from runtime.train.owners import owned
from tests.support.gradcheck import (
    EPS,
    LOSSES,
    forward_runner,
    mismatches,
    numeric_gradients,
    typed_model,
)
from tests.support.train_models import (
    FRESH_FORMS,
    as_float64,
    attention,
    batch_for,
    classes_of,
    cnn,
    exported,
    fresh,
    mlp,
    tied,
)

MODELS = {"mlp": mlp, "cnn": cnn, "attention": attention, "exported": exported, "tied": tied}


def labels_for(model: onnx.ModelProto, rng: np.random.Generator, batch: int, loss: str
               ) -> np.ndarray:
    if loss == "cross_entropy":
        return rng.integers(0, classes_of(model), batch)
    return rng.standard_normal((batch, classes_of(model)))


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_whole_model_matches_central_differences(name: str, loss: str) -> None:
    rng = np.random.default_rng()
    model = as_float64(MODELS[name](rng))
    batch = int(rng.integers(2, 5))
    feeds = batch_for(model, rng, batch)
    labels = labels_for(model, rng, batch, loss)
    value, analytic = loss_and_gradients(model, feeds, labels, loss)
    assert not mismatches(analytic, numeric_gradients(model, feeds, labels, loss))
    run, _ = forward_runner(model)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.DOUBLE}
    # 1e-7: onnx's reference evaluator, which runs float64 Erf here, computes it in float32
    assert value == pytest.approx(LOSSES[loss](run({**feeds, **weights}), labels), rel=1e-7)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float32_gradients_agree_with_float64(name: str) -> None:
    """What a float32 model's gradients lose to float64: 1e-4 relative (a gradient that is
    zero in exact arithmetic, a bias before batch norm, is float32 noise: 1e-6 of the
    largest gradient absolute)."""
    rng = np.random.default_rng()
    model = MODELS[name](rng)
    feeds = batch_for(model, rng, 8)
    labels = labels_for(model, rng, 8, "cross_entropy")
    single = gradients(model, feeds, labels)
    double = gradients(as_float64(model), {k: v.astype(np.float64) if v.dtype.kind == "f"
                                           else v for k, v in feeds.items()}, labels)
    scale = max(float(np.abs(g).max()) for g in double.values())
    for w, want in double.items():
        assert single[w].dtype == np.float32
        np.testing.assert_allclose(single[w], want, rtol=1e-4, atol=1e-6 * scale, err_msg=w)


@pytest.mark.parametrize("name", ["cnn", "attention"])
def test_float16_gradients_agree_with_float32(name: str) -> None:
    """A float16 network's gradients, its MaxPool's and embedding's too, which add into a
    zero tensor by index (onnxruntime's CPU scatter adds no float16: Prism adds in float),
    within float16's rounding of those of its float32 twin holding the same values: 2%
    relative, 0.5% of the largest gradient absolute (60 draws stayed under a tenth)."""
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    half, single = (MODELS[name](np.random.default_rng(seed), dtype) for dtype in
                    (np.float16, np.float32))
    values = {t.name: numpy_helper.to_array(t) for t in half.graph.initializer}
    for t in single.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(values[t.name].astype(np.float32), t.name))
    feeds = {k: v.astype(np.float16) if v.dtype.kind == "f" else v
             for k, v in batch_for(single, rng, 8).items()}
    labels = labels_for(single, rng, 8, "cross_entropy")
    want = gradients(single, {k: v.astype(np.float32) if v.dtype.kind == "f" else v
                              for k, v in feeds.items()}, labels)
    got = gradients(half, feeds, labels)
    scale = max(float(np.abs(g).max()) for g in want.values())
    for w, g in want.items():
        assert got[w].dtype == np.float16
        np.testing.assert_allclose(got[w].astype(np.float32), g, rtol=2e-2, atol=5e-3 * scale,
                                   err_msg=w)


@pytest.mark.parametrize("form", [f for f in FRESH_FORMS if f != "separate"])
def test_an_exported_network_owned_has_pytorchs_gradients(form: str) -> None:
    """A fresh network's equal parameters (zero biases, unit LayerNorm scales, two layer
    scales of one module) that an exporter stored once: as given, the one initializer's
    gradient is the sum of its readers' (the file's function: a LayerNorm scale); owned
    (`owners.owned`), each parameter has PyTorch's gradient under PyTorch's name, and the
    tied matrix, which the exporter read again through a folded transpose or copy, is one
    weight again, its gradient the sum of both uses."""
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    separate = fresh(np.random.default_rng(seed))
    merged = fresh(np.random.default_rng(seed), form)
    feeds, labels = batch_for(separate, rng, 4), rng.integers(0, 3, 4)
    want = gradients(separate, feeds, labels)
    as_given = gradients(merged, feeds, labels)
    assert as_given.keys() == {t.name for t in merged.graph.initializer}
    np.testing.assert_allclose(as_given["ln1.weight"], want["ln1.weight"] + want["ln2.weight"],
                               rtol=1e-5, atol=1e-7)
    got = gradients(owned(load_graph(merged, fold=False)), feeds, labels)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        np.testing.assert_allclose(got[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("form", ["separate", "scopes"])
def test_equal_parameters_that_are_no_fill_stay_two(form: str) -> None:
    """Two identity-initialized projections (ConViT's): written apart they stay two, equal
    as they are; stored once by dynamo, whose FX nodes name both, they are two again."""
    rng = np.random.default_rng()
    width = int(rng.integers(3, 6))
    mk = helper.make_node
    params = {"a.weight": np.eye(width), "b.weight": np.eye(width),
              "out.weight": rng.standard_normal((width, 3))}
    steps = [("a", "x", "h1"), ("b", "t1", "h2"), ("out", "t2", "logits")]

    def model(merged: bool) -> onnx.ModelProto:
        nodes = []
        for k, (module, x, y) in enumerate(steps):
            weight = "a.weight" if merged and module == "b" else f"{module}.weight"
            node = mk("MatMul", [x, weight], [y], name=f"node_matmul_{k}")
            helper.set_metadata_props(node, {
                "pkg.torch.onnx.name_scopes": repr(["", module, f"matmul_{k}"]),
                "pkg.torch.onnx.fx_node": f"%matmul_{k} : [num_users=1] = call_function"
                f"[target=torch.ops.aten.matmul](args = (%{x}, %p_{module}_weight),"
                " kwargs = {})"})
            nodes += [node, *([mk("Tanh", [y], [f"t{k + 1}"])] if module != "out" else [])]
        weights = {n: v for n, v in params.items() if not (merged and n == "b.weight")}
        return typed_model(nodes, {n: v.astype(np.float32) for n, v in weights.items()},
                           ["logits"], {"x": rng.standard_normal((4, width)).astype(np.float32)})

    separate = model(False)
    feeds, labels = {"x": rng.standard_normal((4, width)).astype(np.float32)}, \
        rng.integers(0, 3, 4)
    want = gradients(separate, feeds, labels)
    got = gradients(owned(load_graph(model(form == "scopes"), fold=False)), feeds, labels)
    assert got.keys() == want.keys() == params.keys()
    for name, grad in want.items():
        np.testing.assert_allclose(got[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_every_backend_runs_the_backward_graph(backend: str) -> None:
    rng = np.random.default_rng()
    model = cnn(rng)
    feeds, labels = batch_for(model, rng, 4), rng.integers(0, 5, 4)
    got = gradients(model, feeds, labels, backend=backend)
    want = gradients(model, feeds, labels, backend="auto")
    for w in want:
        np.testing.assert_allclose(got[w], want[w], rtol=1e-4, atol=1e-6, err_msg=w)


@pytest.mark.parametrize("ignored", [0, 2], ids=["all labelled", "two ignored"])
def test_matches_pytorch_autograd(ignored: int) -> None:
    """Labels of -100, F.cross_entropy's ignore_index, count for nothing there too."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    model = as_float64(mlp(rng, sizes=(5, 7, 4)))
    feeds, labels = batch_for(model, rng, 6), rng.integers(0, 4, 6)
    labels[rng.choice(6, ignored, replace=False)] = -100
    ours = gradients(model, feeds, labels)
    w = {t.name: torch.tensor(numpy_helper.to_array(t), requires_grad=True)
         for t in model.graph.initializer}
    x = torch.tensor(feeds["x"])
    hidden = torch.relu(x @ w["w0"].T + w["b0"])
    logits = hidden @ w["w1"].T + w["b1"]
    torch.nn.functional.cross_entropy(logits, torch.tensor(labels)).backward()
    for name, tensor in w.items():
        np.testing.assert_allclose(ours[name], tensor.grad.numpy(), rtol=1e-4, atol=1e-10)


def test_a_cnn_matches_pytorch_autograd() -> None:
    """Convolution, batch norm in training mode, max pooling, an RMS norm and a linear
    layer, written in PyTorch on the same weights."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    rng = np.random.default_rng()
    model = as_float64(exported(rng))
    feeds, labels = batch_for(model, rng, 5), rng.integers(0, 4, 5)
    ours = gradients(model, feeds, labels)
    w = {t.name: torch.tensor(numpy_helper.to_array(t), requires_grad=True)
         for t in model.graph.initializer}
    h = functional.conv2d(torch.tensor(feeds["image"]), w["conv.weight"], w["conv.bias"],
                          padding=1)
    h = functional.batch_norm(h, w["bn.running_mean"].detach().clone(),
                              w["bn.running_var"].detach().clone(), w["bn.weight"],
                              w["bn.bias"], training=True, eps=1e-5)
    h = functional.max_pool2d(functional.relu(h), 2).flatten(1)
    h = h / torch.sqrt((h ** 2).mean(1, keepdim=True) + 1e-5)
    logits = functional.linear(h, w["fc.weight"], w["fc.bias"])
    functional.cross_entropy(logits, torch.tensor(labels)).backward()
    for name in ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"):
        np.testing.assert_allclose(ours[name], w[name].grad.numpy(), rtol=1e-4, atol=1e-10,
                                   err_msg=name)


# ConvTranspose where onnx's reference evaluator (which runs float64) computes it unlike
# onnxruntime: groups and output_shape, where the reference backend's kernels now stand
# in, and SAME with a kernel shorter than its stride, where the spec and onnxruntime part.
# kernel, attributes
CONV_TRANSPOSE_WAYS = {
    "groups": ((3, 2), {"group": 2, "strides": [2, 2], "output_padding": [1, 0],
                        "pads": [1, 0, 0, 1]}),
    "output_shape": ((3, 2), {"group": 2, "strides": [2, 1], "output_shape": [6, 2]}),
    "output_shape past the windows": ((3, 2), {"group": 2, "strides": [2, 1],
                                               "output_shape": [8, 3]}),
    "SAME, a short kernel": ((1, 2), {"group": 2, "strides": [3, 2], "auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("way", sorted(CONV_TRANSPOSE_WAYS))
def test_conv_transpose_matches_onnxruntime_where_the_reference_evaluator_does_not(
        way: str) -> None:
    """ConvTranspose is linear in each operand, so mse's central differences over any
    step are exact: float32 onnxruntime is the numeric side."""
    import onnxruntime as ort

    kernel, attrs = CONV_TRANSPOSE_WAYS[way]
    rng = np.random.default_rng()
    operands = {"x": rng.standard_normal((2, 4, 3, 2)), "w": rng.standard_normal((4, 2, *kernel)),
                "b": rng.standard_normal(4)}
    operands = {k: v.astype(np.float32) for k, v in operands.items()}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", **attrs)
    fed = typed_model([node], {}, ["y"], operands)  # every operand an input: varied below
    session = ort.InferenceSession(fed.SerializeToString(), providers=["CPUExecutionProvider"])
    target = rng.standard_normal(session.run(None, operands)[0].shape)

    def loss(name: str, value: np.ndarray) -> float:
        y = session.run(None, {**operands, name: value})[0]
        return float(np.mean((y.astype(np.float64) - target) ** 2))

    ours = gradients(typed_model([node], operands, ["y"]), {}, target.astype(np.float32),
                     loss="mse")
    for name, value in operands.items():
        numeric = np.zeros(value.shape)
        for i in np.ndindex(value.shape):
            up, down = value.copy(), value.copy()
            up[i] += 0.5
            down[i] -= 0.5
            numeric[i] = loss(name, up) - loss(name, down)
        np.testing.assert_allclose(ours[name], numeric, rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_an_upsampling_as_exported_matches_pytorch_autograd(mode: str) -> None:
    """Resize's roi and scales are initializers, as exporters write them: settings, not
    weights."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    x, w = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((1, 3, 1, 1))
    onnx_mode = {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"}[mode]
    attrs = {"nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"} \
        if mode == "nearest" else {"cubic_coeff_a": -0.75}
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("Resize", ["h", "roi", "scales"], ["y"], mode=onnx_mode,
                              **attrs)]
    model = typed_model(nodes, {"w": w.astype(np.float32), "roi": np.zeros(0, np.float32),
                                "scales": np.asarray([1, 1, 2, 2], np.float32)}, ["y"],
                        {"x": x.astype(np.float32)})
    target = rng.standard_normal((2, 3, 8, 10)).astype(np.float32)
    ours = gradients(model, {"x": x.astype(np.float32)}, target, loss="mse")
    assert set(ours) == {"w"}
    weight = torch.tensor(w, requires_grad=True)
    up = torch.nn.functional.interpolate(
        torch.tensor(x) * weight, scale_factor=2, mode=mode,
        **({} if mode == "nearest" else {"align_corners": False}))
    torch.nn.functional.mse_loss(up, torch.tensor(target, dtype=torch.float64)).backward()
    np.testing.assert_allclose(ours["w"], weight.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_an_upsample_below_opset_11_trains_as_onnxruntime_runs_it() -> None:
    """Training raises the model to its opset by onnx's version converter, which wrote the
    Upsample as a Resize mapping half-pixel centres (torchvision's FCN at opset 9 then
    trained a function 5.1 off the one it serves): its loss is the model's as onnxruntime
    runs it, its gradients those of the same model in today's Resize."""
    rng = np.random.default_rng()
    x, w = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((1, 3, 1, 1))
    feeds, weights = {"x": x.astype(np.float32)}, {"w": w.astype(np.float32)}
    scales = numpy_helper.from_array(np.asarray([1, 1, 2, 2.5], np.float32))

    def model(opset: int, resize: onnx.NodeProto) -> onnx.ModelProto:
        nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
                 helper.make_node("Constant", [], ["scales"], value=scales), resize]
        return typed_model(nodes, weights, ["y"], feeds, opset=opset)

    old = model(9, helper.make_node("Upsample", ["h", "scales"], ["y"], mode="linear"))
    today = model(17, helper.make_node("Resize", ["h", "", "scales"], ["y"], mode="linear",
                                       coordinate_transformation_mode="asymmetric"))
    target = rng.standard_normal((2, 3, 8, 12)).astype(np.float32)
    value, ours = loss_and_gradients(old, feeds, target, loss="mse")
    run, _ = forward_runner(old)
    assert value == pytest.approx(LOSSES["mse"](run({**feeds, **weights}), target), rel=1e-5)
    np.testing.assert_allclose(ours["w"], gradients(today, feeds, target, loss="mse")["w"],
                               rtol=1e-5, atol=1e-7)


def test_running_statistics_get_zero_gradients() -> None:
    """In training the batch norm uses batch statistics: its running ones do not move the
    loss."""
    rng = np.random.default_rng()
    model = cnn(rng)
    grads = gradients(model, batch_for(model, rng, 3), rng.integers(0, 5, 3))
    assert not grads["bn.mean"].any() and not grads["bn.var"].any()
    assert grads["bn.scale"].any() and grads["conv1.w"].any()


def branches(reads: str) -> onnx.GraphProto:
    """Two branches of an If: Relu or Neg of `reads`, from the scope around them."""
    return [helper.make_graph([helper.make_node(op, [reads], [f"{op}_out"])], op.lower(), [],
                              [helper.make_tensor_value_info(f"{op}_out", onnx.TensorProto.DOUBLE,
                                                             None)])
            for op in ("Relu", "Neg")]


def branch_model(rng: np.random.Generator, reads: str) -> onnx.ModelProto:
    """h = If(flag, Relu(`reads`), Neg(`reads`)), its branches reading `reads` from around
    them; then h @ w."""
    then, other = branches(reads)
    nodes = [helper.make_node("If", ["flag"], ["h"], name="the_if", then_branch=then,
                              else_branch=other),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="mm")]
    return typed_model(nodes, {"w": rng.standard_normal((3, 2)), "v": rng.standard_normal((4, 3))},
                       ["y"], {"flag": np.asarray(True), "x": rng.standard_normal((4, 3))})


def test_a_branch_reading_the_data_from_around_it_runs_in_the_forward() -> None:
    """The If reads x only inside its branches: what it reads there is the model's to give
    it, though it needs no gradient."""
    rng = np.random.default_rng()
    model = branch_model(rng, "x")
    feeds = {"flag": np.asarray(bool(rng.integers(0, 2))), "x": rng.standard_normal((4, 3))}
    target = rng.standard_normal((4, 2))
    ours = gradients(model, feeds, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(model, feeds, target, "mse"))
    assert ours["w"].any()


def test_a_branch_reading_a_weight_from_around_it_is_refused_naming_it() -> None:
    rng = np.random.default_rng()
    with pytest.raises(TrainingError) as info:
        gradients(branch_model(rng, "v"), {"flag": np.asarray(True),
                                            "x": rng.standard_normal((4, 3))},
                  rng.standard_normal((4, 2)), loss="mse")
    assert "the_if (If) has no gradient rule" in str(info.value)


def test_an_if_the_shapes_decide_trains_as_its_branch_nested_ones_too() -> None:
    """TorchScript tests ranks and sizes with an If (LocalResponseNorm's squeeze): its
    condition fixed by the batch, the taken branch is inlined, so a weight read inside
    trains. The taken branch holds another such If, decided on the next probe."""
    rng = np.random.default_rng()
    mk, dbl = helper.make_node, onnx.TensorProto.DOUBLE

    def branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, dbl, None)])

    inner = [branch("relu", [mk("MatMul", ["x", "v"], ["a1"]), mk("Relu", ["a1"], ["r"])], "r"),
             branch("neg", [mk("MatMul", ["x", "v"], ["a2"]), mk("Neg", ["a2"], ["g"])], "g")]
    then = branch("then", [mk("Shape", ["x"], ["s"]),
                           mk("Gather", ["s", "zero"], ["rows"], axis=0),
                           mk("Greater", ["rows", "one"], ["many"]),
                           mk("If", ["many"], ["t"], then_branch=inner[0],
                              else_branch=inner[1])], "t")
    other = branch("else", [mk("Neg", ["x"], ["e"])], "e")
    nodes = [mk("Shape", ["x"], ["shape"]), mk("Size", ["shape"], ["rank"]),
             mk("Equal", ["rank", "two"], ["is_matrix"]),
             mk("If", ["is_matrix"], ["h"], name="by_rank", then_branch=then, else_branch=other),
             mk("MatMul", ["h", "w"], ["y"], name="mm")]
    ints = {"two": np.asarray(2, np.int64), "zero": np.asarray(0, np.int64),
            "one": np.asarray(1, np.int64)}
    model = typed_model(nodes, {"v": rng.standard_normal((3, 3)), "w": rng.standard_normal((3, 2)),
                                **ints}, ["y"], {"x": rng.standard_normal((4, 3))})
    feeds, target = {"x": rng.standard_normal((4, 3))}, rng.standard_normal((4, 2))
    ours = gradients(model, feeds, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(model, feeds, target, "mse"))
    assert ours["v"].any() and ours["w"].any()


def test_a_loop_the_shapes_decide_trains_unrolled() -> None:
    """A recurrence over x's rows as TorchScript exports one (its trip count from Shape,
    its condition passed through): unrolled, its carried state and weights train; a trip
    count the data gives leaves it refused."""
    rng = np.random.default_rng()
    mk, dbl = helper.make_node, onnx.TensorProto.DOUBLE
    body = helper.make_graph(
        [mk("Gather", ["x", "i"], ["row"], axis=0), mk("MatMul", ["h", "w"], ["hw"]),
         mk("Add", ["hw", "row"], ["pre"]), mk("Tanh", ["pre"], ["h_next"]),
         mk("Identity", ["cond"], ["cond_out"]), mk("Identity", ["h_next"], ["h_seen"])],
        "step", [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", dbl, None)],
        [helper.make_tensor_value_info(n, t, None) for n, t in (
            ("cond_out", onnx.TensorProto.BOOL), ("h_next", dbl), ("h_seen", dbl))])
    rows, width = (int(v) for v in rng.integers(2, 5, 2))

    def model(trips: list[onnx.NodeProto], feeds: dict) -> onnx.ModelProto:
        nodes = [*trips, mk("Loop", ["trips", "", "h0"], ["h_last", "seen"], name="recur",
                            body=body),
                 mk("Reshape", ["seen", "flat"], ["states"]),
                 mk("MatMul", ["states", "w2"], ["y"], name="out")]
        return typed_model(nodes, {"w": rng.standard_normal((width, width)) / 2,
                                   "h0": rng.standard_normal((1, width)),
                                   "w2": rng.standard_normal((width, 2)),
                                   "zero": np.asarray(0, np.int64),
                                   "flat": np.asarray([-1, width], np.int64)}, ["y"], feeds)

    x = rng.standard_normal((rows, width))
    shaped = model([mk("Shape", ["x"], ["shape"]), mk("Gather", ["shape", "zero"], ["trips"])],
                   {"x": x})
    target = rng.standard_normal((rows, 2))
    ours = gradients(shaped, {"x": x}, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(shaped, {"x": x}, target, "mse"))
    assert ours["w"].any() and ours["h0"].any()
    fed = model([], {"x": x, "trips": np.asarray(rows, np.int64)})
    with pytest.raises(TrainingError, match="recur \\(Loop\\) has no gradient rule"):
        gradients(fed, {"x": x, "trips": np.asarray(rows, np.int64)}, target, loss="mse")


def test_a_while_loop_counting_to_the_sequence_length_trains_unrolled() -> None:
    """A recurrence as tf2onnx writes TensorFlow's while loop (Keras' SimpleRNN): no trip
    count, a condition on entry from two float constants, and in the body a carried counter
    compared with the carried row count; run alone, those nodes give the trip count. A
    condition the carried state also decides (the data) leaves it refused."""
    rng = np.random.default_rng()
    mk, dbl, i64 = helper.make_node, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT64

    def body(condition: list[onnx.NodeProto]) -> onnx.GraphProto:
        return helper.make_graph(
            [mk("Gather", ["x", "t"], ["row"], axis=0), mk("MatMul", ["h", "w"], ["hw"]),
             mk("Add", ["hw", "row"], ["pre"]), mk("Tanh", ["pre"], ["h_next"]),
             mk("Add", ["t", "one"], ["t_next"]), mk("Identity", ["n"], ["n_out"]),
             mk("Identity", ["h_next"], ["h_seen"]), *condition], "step",
            [helper.make_tensor_value_info("i", i64, []),
             helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
             *(helper.make_tensor_value_info(n, t, None) for n, t in (
                 ("t", i64), ("n", i64), ("h", dbl)))],
            [helper.make_tensor_value_info(n, t, None) for n, t in (
                ("go", onnx.TensorProto.BOOL), ("t_next", i64), ("n_out", i64),
                ("h_next", dbl), ("h_seen", dbl))])

    rows, width = (int(v) for v in rng.integers(2, 6, 2))
    below = [mk("Cast", ["t_next"], ["tf"], to=dbl), mk("Cast", ["n"], ["nf"], to=dbl)]
    counted = body([*below, mk("Less", ["tf", "nf"], ["go"])])
    by_state = body([*below, mk("Less", ["tf", "nf"], ["more"]),
                     mk("ReduceSum", ["h_next"], ["total"], keepdims=0),
                     mk("Less", ["total", "high"], ["small"]),
                     mk("And", ["more", "small"], ["go"])])

    def model(step: onnx.GraphProto) -> onnx.ModelProto:
        nodes = [mk("Less", ["low", "high"], ["enter"]), mk("Shape", ["x"], ["shape"]),
                 mk("Gather", ["shape", "zero"], ["n0"]),
                 mk("Loop", ["", "enter", "zero", "n0", "h0"], ["t_end", "n_end", "h_last",
                                                              "seen"], name="while", body=step),
                 mk("Reshape", ["seen", "flat"], ["states"]),
                 mk("MatMul", ["states", "w2"], ["y"], name="out")]
        return typed_model(nodes, {"w": rng.standard_normal((width, width)) / 2,
                                   "h0": rng.standard_normal((1, width)),
                                   "w2": rng.standard_normal((width, 2)),
                                   "low": np.asarray(0.0), "high": np.asarray(1e3),
                                   "zero": np.asarray(0, np.int64), "one": np.asarray(1, np.int64),
                                   "flat": np.asarray([-1, width], np.int64)}, ["y"], {"x": x})

    x = rng.standard_normal((rows, width))
    target = rng.standard_normal((rows, 2))
    recurrence = model(counted)
    ours = gradients(recurrence, {"x": x}, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(recurrence, {"x": x}, target, "mse"))
    assert ours["w"].any() and ours["h0"].any()
    with pytest.raises(TrainingError, match="while \\(Loop\\) has no gradient rule"):
        gradients(model(by_state), {"x": x}, target, loss="mse")


@pytest.mark.parametrize("split", ["sizes", "scalar", "none"])
def test_a_split_into_a_sequence_read_at_fixed_positions_trains_as_a_split(split: str) -> None:
    """An unoptimized dynamo export writes torch.split and chunk as SplitToSequence read by
    SequenceAt: given sizes, a size with the remainder last, or pieces of 1 squeezed away
    (unbind); each trains as a Split. A position the data gives leaves it refused."""
    rng = np.random.default_rng()
    mk = helper.make_node
    rows, width = int(rng.integers(2, 4)), int(rng.integers(5, 8))
    given = {"sizes": [mk("SplitToSequence", ["h", "sizes"], ["seq"], axis=1)],
             "scalar": [mk("SplitToSequence", ["h", "two"], ["seq"], axis=1)],
             "none": [mk("SplitToSequence", ["h"], ["seq"], axis=1, keepdims=0)]}[split]
    first = int(rng.integers(1, width))
    weights = {"w": rng.standard_normal((width, width)), "sizes": np.asarray(
        [first, width - first], np.int64), "two": np.asarray(2, np.int64),
        "at0": np.asarray(0, np.int64), "last": np.asarray(-1, np.int64)}

    def model(position: str, feeds: dict) -> onnx.ModelProto:
        nodes = [mk("MatMul", ["x", "w"], ["h"]), *given,
                 mk("SequenceAt", ["seq", "at0"], ["a"], name="at_first"),
                 mk("SequenceAt", ["seq", position], ["b"], name="at_other"),
                 *(mk("ReduceSum", [p], [f"s{p}"], keepdims=0, axes=[-1]) if split != "none"
                   else mk("Identity", [p], [f"s{p}"]) for p in "ab"),
                 mk("Mul", ["sa", "sb"], ["y"])]
        return typed_model(nodes, weights, ["y"], feeds, opset=11)

    x = rng.standard_normal((rows, width))
    target = rng.standard_normal(rows)
    fixed = model("last", {"x": x})
    ours = gradients(fixed, {"x": x}, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(fixed, {"x": x}, target, "mse"))
    assert ours["w"].any()
    at = np.asarray(1, np.int64)
    fed = model("at", {"x": x, "at": at})
    with pytest.raises(TrainingError, match="has no gradient rule"):
        gradients(fed, {"x": x, "at": at}, target, loss="mse")


@pytest.mark.parametrize("step", ["Floor", "Ceil", "Round", "Sign", "Hardmax"])
def test_a_step_passes_no_gradient_back_as_in_pytorch(step: str) -> None:
    rng = np.random.default_rng()
    nodes = [helper.make_node("Mul", ["x", "w1"], ["a"]), helper.make_node(step, ["a"], ["s"]),
             helper.make_node("Mul", ["s", "w2"], ["y"])]
    x = rng.uniform(-3, 3, (4, 3))
    model = typed_model(nodes, {"w1": rng.uniform(0.5, 2, 3), "w2": rng.standard_normal(3)},
                        ["y"], {"x": x})
    target = rng.standard_normal((4, 3))
    ours = gradients(model, {"x": x}, target, loss="mse")
    assert not mismatches(ours, numeric_gradients(model, {"x": x}, target, "mse"))
    assert not ours["w1"].any() and ours["w2"].any()


# -- refusals ------------------------------------------------------------------------------


def test_an_op_without_a_rule_is_refused_naming_node_and_op() -> None:
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(4, 3))
    node = helper.make_node("ReverseSequence", ["h0", "lengths"], ["bent"], name="the_turn",
                            batch_axis=0, time_axis=1)
    model.graph.node.append(node)
    model.graph.initializer.append(numpy_helper.from_array(np.asarray([2, 3]), "lengths"))
    model.graph.output[0].name = "bent"
    with pytest.raises(TrainingError) as info:
        gradients(model, batch_for(model, rng, 2), rng.integers(0, 3, 2))
    message = str(info.value)
    assert "the_turn" in message and "(ReverseSequence)" in message and "\n" not in message


def test_an_lstm_with_what_pytorch_never_exports_is_refused_naming_it() -> None:
    rng = np.random.default_rng()
    weights = {"w": rng.standard_normal((1, 8, 3)), "r": rng.standard_normal((1, 8, 2))}
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="the_lstm", hidden_size=2,
                            clip=1.0)
    x = rng.standard_normal((4, 2, 3))
    with pytest.raises(TrainingError, match=r"^node the_lstm \(LSTM\): training supports no clip$"):
        gradients(typed_model([node], weights, ["y"], {"x": x}), {"x": x},
                  rng.standard_normal((4, 1, 2, 2)), loss="mse")


@pytest.mark.parametrize("equation", ["...ij,...jk->...ik", "ii,ij->ij"])
def test_an_einsum_with_an_ellipsis_or_a_diagonal_is_refused_naming_it(equation: str) -> None:
    rng = np.random.default_rng()
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="the_einsum", equation=equation)
    model = typed_model([node], {"a": rng.standard_normal((3, 3)),
                                 "b": rng.standard_normal((3, 3))}, ["y"])
    with pytest.raises(TrainingError, match=r"^node the_einsum \(Einsum\): .*ellipsis"):
        gradients(model, {}, rng.standard_normal((3, 3)), loss="mse")


def test_a_forward_pass_that_fails_is_one_quiet_line(capfd) -> None:
    """onnxruntime logged the failed run to stderr as well, under the CLI's one line."""
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(4, 3))
    model.graph.initializer.append(numpy_helper.from_array(np.asarray([-1, 5]), "five"))
    model.graph.node.append(helper.make_node("Reshape", [model.graph.output[0].name, "five"],
                                             ["fives"], name="the_reshape"))
    model.graph.output[0].name = "fives"
    capfd.readouterr()
    with pytest.raises(TrainingError) as info:
        gradients(model, batch_for(model, rng, 2), rng.integers(0, 3, 2))
    assert "the_reshape" in str(info.value) and "\n" not in str(info.value)
    assert capfd.readouterr().err == ""


def test_a_model_without_float_weights_is_refused() -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "bare",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                             [2, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
                                                             [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=9)
    with pytest.raises(TrainingError, match="no trainable weights"):
        gradients(model, {"x": np.zeros((2, 3), np.float32)}, np.zeros(2, np.int64))


@pytest.mark.parametrize(("loss", "labels", "says"), [
    ("cross_entropy", np.zeros((4, 3)), "integer class labels"),
    ("cross_entropy", np.zeros((4, 1), np.int64), "must have shape [4]"),
    ("cross_entropy", np.asarray([0, 1, 2, 3]), "label 3 is outside the 3 classes"),
    ("mse", np.zeros(4, np.int64), "float targets"),
    ("mse", np.zeros((4, 2)), "prediction's shape [4, 3]"),
    ("hinge", np.zeros(4, np.int64), "unknown loss"),
    ("mse", {"y": np.zeros((4, 3))}, "one array of targets .* not a mapping"),  # was "object []"
])
def test_labels_that_do_not_fit_are_refused(loss: str, labels: np.ndarray, says: str) -> None:
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(4, 3))
    with pytest.raises(TrainingError, match=f"^.*{says.replace('[', '.').replace(']', '.')}"):
        gradients(model, batch_for(model, rng, 4), labels, loss)


def test_a_language_models_token_labels_take_the_classes_on_the_last_axis() -> None:
    """Logits [batch, tokens, vocabulary] and labels [batch, tokens], as transformers'
    causal models take them, were refused: PyTorch's cross_entropy wants the classes
    second. The loss is theirs over the last axis, its gradients those of the logits
    moved to have the classes second."""
    rng = np.random.default_rng()
    batch, tokens, width = (int(n) for n in rng.integers(2, 5, 3))
    vocabulary = tokens + int(rng.integers(1, 4))
    weights = {"w": rng.standard_normal((width, vocabulary))}
    feeds = {"x": rng.standard_normal((batch, tokens, width))}
    labels = rng.integers(0, vocabulary, (batch, tokens))
    last = typed_model([helper.make_node("MatMul", ["x", "w"], ["logits"])], weights,
                       ["logits"], feeds)
    second = typed_model([helper.make_node("MatMul", ["x", "w"], ["scores"]),
                          helper.make_node("Transpose", ["scores"], ["logits"], perm=[0, 2, 1])],
                         weights, ["logits"], feeds)
    loss, grads = loss_and_gradients(last, feeds, labels)
    want_loss, want = loss_and_gradients(second, feeds, labels)
    logits = feeds["x"] @ weights["w"]
    assert loss == pytest.approx(LOSSES["cross_entropy"](logits.transpose(0, 2, 1), labels))
    assert loss == pytest.approx(want_loss)
    np.testing.assert_allclose(grads["w"], want["w"], rtol=1e-6, atol=1e-12)


def test_feeds_that_do_not_fit_are_refused() -> None:
    rng = np.random.default_rng()
    model = mlp(rng, sizes=(4, 3))
    with pytest.raises(InvalidInputError, match="'x'"):
        gradients(model, {"x": np.zeros((4, 4), np.float64)}, np.zeros(4, np.int64))


def test_central_differences_step_inside_a_kink_near_the_weights() -> None:
    """A Relu whose input lies within gradcheck's step of 0: the slopes either side
    differ, and the difference across the kink is neither (a fresh cnn's check failed so,
    one element of 108 3% off); the gradient is the slope on the weights' own side."""
    rng = np.random.default_rng()
    x = rng.uniform(0.5, 2.0, (1, 1))
    w = rng.uniform(0.1, 0.9, (1, 1)) * EPS  # x·w > 0 > x·(w - EPS)
    label = rng.uniform(1.0, 2.0, (1, 1))
    model = typed_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                         helper.make_node("Relu", ["m"], ["y"])], {"w": w}, ["y"], {"x": x})
    numeric = numeric_gradients(model, {"x": x}, label, "mse")
    np.testing.assert_allclose(numeric["w"], 2 * (x @ w - label) * x, rtol=1e-6)
