"""Small trainable models, written with onnx.helper, random weights from a given generator:
an MLP, a CNN (with batch norm), and an attention block (embedding, LayerNorm, softmax
attention, an Erf-written Gelu), each with a symbolic batch dimension."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

Rng = np.random.Generator


def _model(nodes: list[onnx.NodeProto], weights: dict[str, np.ndarray],
           inputs: list[onnx.ValueInfoProto], output: str, out_dims: list, dtype: np.dtype,
           opset: int = 17) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        nodes, "trainable", inputs, [helper.make_tensor_value_info(output, elem, out_dims)],
        [numpy_helper.from_array(np.asarray(v, dtype=dtype if v.dtype.kind == "f"
                                            else v.dtype), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9)


def _uniform(rng: Rng, fan_in: int, *shape: int) -> np.ndarray:
    bound = 1 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape)


def mlp(rng: Rng, dtype=np.float32, sizes: tuple[int, ...] = (6, 8, 5, 3)) -> onnx.ModelProto:
    """Gemm, Relu, Gemm, Tanh, Gemm: x [batch, sizes[0]] -> logits [batch, sizes[-1]]."""
    nodes, weights, x = [], {}, "x"
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        weights[f"w{i}"] = _uniform(rng, a, b, a)
        weights[f"b{i}"] = _uniform(rng, a, b)
        y = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], transB=1,
                                      name=f"fc{i}"))
        if i < len(sizes) - 2:
            act = "Relu" if i % 2 == 0 else "Tanh"
            nodes.append(helper.make_node(act, [y], [f"{y}_act"], name=f"act{i}"))
            y = f"{y}_act"
        x = y
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return _model(nodes, weights, [helper.make_tensor_value_info("x", elem,
                                                                 ["batch", sizes[0]])],
                  x, ["batch", sizes[-1]], dtype)


def tied(rng: Rng, dtype=np.float32, width: int = 8, middle: int = 4, classes: int = 3
         ) -> onnx.ModelProto:
    """One weight read at both ends, as tied embeddings are: x [batch, width] -> MatMul
    by `tied` (node "first"), Relu, `middle` Gemm+Tanh layers, MatMul by `tied` again
    (node "last"), Relu, Gemm -> logits [batch, classes]. A plan over two stages puts
    the two readers apart."""
    weights = {"tied": _uniform(rng, width, width, width)}
    nodes = [helper.make_node("MatMul", ["x", "tied"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["h"], name="relu_first")]
    x = "h"
    for i in range(middle):
        weights[f"w{i}"], weights[f"b{i}"] = _uniform(rng, width, width, width), \
            _uniform(rng, width, width)
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], transB=1,
                                   name=f"fc{i}"),
                  helper.make_node("Tanh", [f"g{i}"], [f"t{i}"], name=f"tanh{i}")]
        x = f"t{i}"
    weights["out_w"], weights["out_b"] = _uniform(rng, width, classes, width), \
        _uniform(rng, width, classes)
    nodes += [helper.make_node("MatMul", [x, "tied"], ["z"], name="last"),
              helper.make_node("Relu", ["z"], ["r"], name="relu_last"),
              helper.make_node("Gemm", ["r", "out_w", "out_b"], ["logits"], transB=1,
                               name="out")]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return _model(nodes, weights, [helper.make_tensor_value_info("x", elem, ["batch", width])],
                  "logits", ["batch", classes], dtype)


def cnn(rng: Rng, dtype=np.float32, channels: tuple[int, int] = (3, 4), side: int = 6,
        classes: int = 5, batch_norm: bool = True) -> onnx.ModelProto:
    """Conv, [BatchNormalization], Relu, MaxPool, Conv, Relu, AveragePool, Flatten, Gemm:
    image [batch, 1, side, side] -> logits [batch, classes]."""
    c1, c2 = channels
    weights = {"conv1.w": _uniform(rng, 9, c1, 1, 3, 3), "conv1.b": _uniform(rng, 9, c1),
               "conv2.w": _uniform(rng, 9 * c1, c2, c1, 3, 3),
               "conv2.b": _uniform(rng, 9 * c1, c2)}
    nodes = [helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4,
                              name="conv1")]
    x = "c1"
    if batch_norm:
        weights.update({"bn.scale": rng.uniform(0.5, 1.5, c1), "bn.bias": rng.normal(0, .1, c1),
                        "bn.mean": np.zeros(c1), "bn.var": np.ones(c1)})
        nodes.append(helper.make_node("BatchNormalization", [x, "bn.scale", "bn.bias",
                                                             "bn.mean", "bn.var"], ["bn"],
                                      name="bn"))
        x = "bn"
    half = side // 2
    flat = c2 * (half // 2) ** 2
    weights.update({"fc.w": _uniform(rng, flat, flat, classes), "fc.b": _uniform(rng, flat,
                                                                                classes)})
    nodes += [helper.make_node("Relu", [x], ["r1"], name="relu1"),
              helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2],
                               name="pool1"),
              helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4,
                               name="conv2"),
              helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
              helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2],
                               strides=[2, 2], name="pool2"),
              helper.make_node("Flatten", ["p2"], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc")]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return _model(nodes, weights, [helper.make_tensor_value_info(
        "image", elem, ["batch", 1, side, side])], "logits", ["batch", classes], dtype)


def attention(rng: Rng, dtype=np.float32, vocab: int = 7, width: int = 4, tokens: int = 3,
              outputs: int = 2) -> onnx.ModelProto:
    """Token ids [batch, tokens] -> an embedding, one head of softmax attention with a
    residual, LayerNormalization, a Gelu written with Erf (as exporters write it), a mean
    over tokens and a MatMul + Add head -> [batch, outputs]."""
    weights = {"embed": rng.normal(0, 1, (vocab, width)),
               "wq": _uniform(rng, width, width, width), "wk": _uniform(rng, width, width, width),
               "wv": _uniform(rng, width, width, width), "ln.scale": rng.uniform(.5, 1.5, width),
               "ln.bias": rng.normal(0, .1, width), "head.w": _uniform(rng, width, width,
                                                                        outputs),
               "head.b": _uniform(rng, width, outputs),
               "scale": np.asarray(1 / math.sqrt(width)), "sqrt2": np.asarray(math.sqrt(2)),
               "one": np.asarray(1.0), "half": np.asarray(0.5)}
    mk = helper.make_node
    nodes = [mk("Gather", ["embed", "ids"], ["e"], name="embed"),
             mk("MatMul", ["e", "wq"], ["q"], name="q"), mk("MatMul", ["e", "wk"], ["k"],
                                                             name="k"),
             mk("MatMul", ["e", "wv"], ["v"], name="v"),
             mk("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             mk("MatMul", ["q", "kt"], ["s"], name="scores"),
             mk("Mul", ["s", "scale"], ["ss"], name="scaled"),
             mk("Softmax", ["ss"], ["a"], axis=-1, name="softmax"),
             mk("MatMul", ["a", "v"], ["att"], name="attend"),
             mk("Add", ["att", "e"], ["res"], name="residual"),
             mk("LayerNormalization", ["res", "ln.scale", "ln.bias"], ["ln"], axis=-1,
                name="ln"),
             mk("Div", ["ln", "sqrt2"], ["g0"], name="gelu_div"),
             mk("Erf", ["g0"], ["g1"], name="gelu_erf"),
             mk("Add", ["g1", "one"], ["g2"], name="gelu_add"),
             mk("Mul", ["ln", "g2"], ["g3"], name="gelu_mul"),
             mk("Mul", ["g3", "half"], ["g"], name="gelu_half"),
             mk("ReduceMean", ["g"], ["pooled"], axes=[1], keepdims=0, name="pool"),
             mk("MatMul", ["pooled", "head.w"], ["hw"], name="head"),
             mk("Add", ["hw", "head.b"], ["out"], name="head_bias")]
    return _model(nodes, weights, [helper.make_tensor_value_info(
        "ids", onnx.TensorProto.INT64, ["batch", tokens])], "out", ["batch", outputs], dtype)


def functions(rng: Rng, dtype=np.float32, width: int = 8, classes: int = 3
              ) -> onnx.ModelProto:
    """Ops onnx defines as functions between Gemms, at RMSNormalization's opset: Gemm,
    Selu, Gemm, RMSNormalization (a scale weight), Gemm, GroupNormalization (two groups),
    Gemm: x [batch, width] -> logits [batch, classes]."""
    weights = {"norm.scale": rng.uniform(0.5, 1.5, width), "group.scale":
               rng.uniform(0.5, 1.5, width), "group.bias": rng.normal(0, 0.1, width)}
    for i, out in enumerate((width, width, width, classes)):
        weights[f"w{i}"], weights[f"b{i}"] = _uniform(rng, width, out, width), \
            _uniform(rng, width, out)
    mk = helper.make_node
    nodes = [mk("Gemm", ["x", "w0", "b0"], ["g0"], transB=1, name="fc0"),
             mk("Selu", ["g0"], ["a0"], name="selu"),
             mk("Gemm", ["a0", "w1", "b1"], ["g1"], transB=1, name="fc1"),
             mk("RMSNormalization", ["g1", "norm.scale"], ["n1"], name="rms"),
             mk("Gemm", ["n1", "w2", "b2"], ["g2"], transB=1, name="fc2"),
             mk("GroupNormalization", ["g2", "group.scale", "group.bias"], ["n2"],
                num_groups=2, name="group"),
             mk("Gemm", ["n2", "w3", "b3"], ["logits"], transB=1, name="out")]
    opset = defs.get_schema("RMSNormalization").since_version
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return _model(nodes, weights, [helper.make_tensor_value_info("x", elem, ["batch", width])],
                  "logits", ["batch", classes], dtype, opset)


def interleaved(rng: Rng, dtype=np.float32, width: int = 8, classes: int = 3
                ) -> tuple[onnx.ModelProto, dict]:
    """A weight `shared` and a scalar `s` each read on two stages, listed so that the
    later stage's reader comes first in the graph: fc0 (Gemm); then b_mul, b_scale (the
    second stage's branch) before a_mul, a_scale (the first's), all by `shared` and `s`;
    join (Add), out (Gemm) -> logits. With the user map it returns for two devices."""
    weights = {"w0": _uniform(rng, width, width, width), "b0": _uniform(rng, width, width),
               "shared": rng.uniform(0.5, 1.5, width), "s": np.asarray(1.5),
               "w1": _uniform(rng, width, classes, width), "b1": _uniform(rng, width, classes)}
    mk = helper.make_node
    nodes = [mk("Gemm", ["x", "w0", "b0"], ["h"], transB=1, name="fc0"),
             mk("Mul", ["h", "shared"], ["u"], name="b_mul"),
             mk("Mul", ["u", "s"], ["u2"], name="b_scale"),
             mk("Mul", ["h", "shared"], ["v"], name="a_mul"),
             mk("Mul", ["v", "s"], ["v2"], name="a_scale"),
             mk("Add", ["u2", "v2"], ["j"], name="join"),
             mk("Gemm", ["j", "w1", "b1"], ["logits"], transB=1, name="out")]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _model(nodes, weights, [helper.make_tensor_value_info("x", elem, ["batch", width])],
                   "logits", ["batch", classes], dtype)
    return model, {"default": "first", "partitions": {"first": "cpu0", "second": "cpu1"},
                   "nodes": dict.fromkeys(["b_mul", "b_scale", "join", "out"], "second")}


def batch_for(model: onnx.ModelProto, rng: Rng, batch: int) -> dict[str, np.ndarray]:
    """Random feeds for one of the models above."""
    name = model.graph.input[0].name
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]
    if name == "ids":
        return {name: rng.integers(0, 7, (batch, *dims)).astype(np.int64)}
    dtype = helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    return {name: rng.standard_normal((batch, *dims)).astype(dtype)}


def classes_of(model: onnx.ModelProto) -> int:
    return model.graph.output[0].type.tensor_type.shape.dim[1].dim_value


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every float32 tensor (weights, constants, inputs, outputs) in
    float64."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for v in (*out.graph.input, *out.graph.output):
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for node in out.graph.node:
        for a in node.attribute:
            if node.op_type == "Constant" and a.t.data_type == onnx.TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(
                    np.float64), a.t.name))
    return out


def exported(rng: Rng, dtype=np.float32, classes: int = 4) -> onnx.ModelProto:
    """As PyTorch's exporter writes a small CNN: Conv, BatchNormalization (inference form),
    Relu, MaxPool, a Flatten through Shape, Gather, Unsqueeze, Concat and Reshape, an RMS
    normalisation with Constant nodes (x / sqrt(mean(x ** 2) + eps)), Dropout, and a Gemm
    with transB: image [batch, 2, 4, 4] -> logits [batch, classes]."""
    c = 3
    flat = c * 2 * 2
    weights = {"conv.weight": _uniform(rng, 18, c, 2, 3, 3), "conv.bias": _uniform(rng, 18, c),
               "bn.weight": rng.uniform(.5, 1.5, c), "bn.bias": rng.normal(0, .1, c),
               "bn.running_mean": np.zeros(c), "bn.running_var": np.ones(c),
               "fc.weight": _uniform(rng, flat, classes, flat),
               "fc.bias": _uniform(rng, flat, classes)}
    mk = helper.make_node

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return mk("Constant", [], [name], value=numpy_helper.from_array(value, name),
                  name=f"/{name}")

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [mk("Conv", ["image", "conv.weight", "conv.bias"], ["c"], pads=[1] * 4,
                name="/conv/Conv"),
             mk("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean",
                                       "bn.running_var"], ["b"], name="/bn/BatchNorm"),
             mk("Relu", ["b"], ["r"], name="/Relu"),
             mk("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                name="/MaxPool"),
             mk("Shape", ["p"], ["shape"], name="/Shape"),
             constant("zero", np.asarray(0, np.int64)),
             mk("Gather", ["shape", "zero"], ["n"], axis=0, name="/Gather"),
             constant("axes0", np.asarray([0], np.int64)),
             mk("Unsqueeze", ["n", "axes0"], ["n1"], name="/Unsqueeze"),
             constant("minus1", np.asarray([-1], np.int64)),
             mk("Concat", ["n1", "minus1"], ["target"], axis=0, name="/Concat"),
             mk("Reshape", ["p", "target"], ["f"], name="/Reshape"),
             constant("two", np.asarray(2.0, dtype)),
             mk("Pow", ["f", "two"], ["sq"], name="/Pow"),
             mk("ReduceMean", ["sq"], ["ms"], axes=[1], keepdims=1, name="/ReduceMean"),
             constant("eps", np.asarray(1e-5, dtype)),
             mk("Add", ["ms", "eps"], ["mse"], name="/Add"),
             mk("Sqrt", ["mse"], ["rms"], name="/Sqrt"),
             mk("Div", ["f", "rms"], ["normed"], name="/Div"),
             mk("Dropout", ["normed"], ["dropped"], name="/Dropout"),
             mk("Gemm", ["dropped", "fc.weight", "fc.bias"], ["logits"], transB=1,
                name="/fc/Gemm")]
    return _model(nodes, weights, [helper.make_tensor_value_info("image", elem,
                                                                 ["batch", 2, 4, 4])],
                  "logits", ["batch", classes], dtype)


FRESH_FORMS = ("separate", "identity", "scopes")


def fresh(rng: Rng, form: str = "separate", width: int = 8, classes: int = 3
          ) -> onnx.ModelProto:
    """A fresh PyTorch network as its exporters write it, x [batch, 6] -> logits: Linear
    fc1, LayerNorm ln1, Tanh, Linear fc2, LayerNorm ln2, two layer scales of module blk
    (lambda_1, lambda_2, both 0.1), a matrix emb.weight read again, transposed, by module
    head (tied), Linear out. Fresh, the biases are zeros, the LayerNorm scales ones.
    `form`: "separate", each parameter its own initializer (as PyTorch holds them);
    "identity", as TorchScript writes equal ones (one initializer, the others an Identity
    of it named as the parameter) and the tie (head reads a folded transpose); "scopes",
    as dynamo does (one initializer read in every slot, each node naming its module and
    its FX node's parameters; head transposes a folded copy of emb.weight)."""
    params = {"fc1.weight": _uniform(rng, 6, width, 6), "fc1.bias": np.zeros(width),
              "ln1.weight": np.ones(width), "ln1.bias": np.zeros(width),
              "fc2.weight": _uniform(rng, width, width, width), "fc2.bias": np.zeros(width),
              "ln2.weight": np.ones(width), "ln2.bias": np.zeros(width),
              "blk.lambda_1": np.full(width, 0.1), "blk.lambda_2": np.full(width, 0.1),
              "emb.weight": _uniform(rng, width, width, width),
              "out.weight": _uniform(rng, width, classes, width),
              "out.bias": _uniform(rng, width, classes)}
    # op, module, inputs ("x": the running value), output (None: the next running value)
    steps = [("Gemm", "fc1", ["x", "fc1.weight", "fc1.bias"], None),
             ("LayerNormalization", "ln1", ["x", "ln1.weight", "ln1.bias"], None),
             ("Tanh", "", ["x"], None),
             ("Gemm", "fc2", ["x", "fc2.weight", "fc2.bias"], None),
             ("LayerNormalization", "ln2", ["x", "ln2.weight", "ln2.bias"], None),
             ("Mul", "blk", ["x", "blk.lambda_1"], None), ("Tanh", "blk", ["x"], None),
             ("Mul", "blk", ["x", "blk.lambda_2"], None),
             ("MatMul", "emb", ["x", "emb.weight"], None), ("Relu", "", ["x"], None),
             ("Transpose", "head", ["emb.weight"], "head.t"),
             ("MatMul", "head", ["x", "head.t"], None),
             ("Gemm", "out", ["x", "out.weight", "out.bias"], "logits")]
    kept: dict[bytes, str] = {}  # an exporter's one initializer for equal values
    reads, nodes = {}, []
    for name, value in params.items():
        first = kept.setdefault(value.astype(np.float32).tobytes(), name)
        reads[name] = name if form == "separate" or first == name else first
        if form == "identity" and first != name:
            nodes.append(helper.make_node("Identity", [first], [name], name=f"Identity_{name}"))
            reads[name] = name
    weights = {n: v for n, v in params.items()
               if form == "separate" or kept[v.astype(np.float32).tobytes()] == n}
    if form == "identity":  # head's Transpose folded
        steps[10:12] = [("MatMul", "head", ["x", "onnx::MatMul_11"], None)]
        weights["onnx::MatMul_11"] = params["emb.weight"].T
    elif form == "scopes":  # head transposes a folded copy
        steps[10] = ("Transpose", "head", ["val_10"], "head.t")
        weights["val_10"] = params["emb.weight"].copy()
    x = "x"
    for k, (op, module, inputs, output) in enumerate(steps):
        out = output or f"h{k}"
        node = helper.make_node(op, [x if i == "x" else reads.get(i, i) for i in inputs], [out],
                                name=f"node_{op.lower()}_{k}",
                                **({"transB": 1} if op == "Gemm" else {}))
        if form == "scopes":
            scopes = ["", *([module] if module else []), f"{op.lower()}_{k}"]
            args = ", ".join("%" + (x if i == "x" else "p_" + i.replace(".", "_"))
                             for i in inputs)
            helper.set_metadata_props(node, {
                "pkg.torch.onnx.name_scopes": repr(scopes),
                "pkg.torch.onnx.fx_node": f"%{op.lower()}_{k} : [num_users=1] = call_function"
                                          f"[target=torch.ops.aten.{op.lower()}](args = ({args}),"
                                          f" kwargs = {{}})"})
        nodes.append(node)
        x = out if output is None else x
    return _model(nodes, weights, [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, ["batch", 6])], "logits", ["batch", classes], np.float32)
