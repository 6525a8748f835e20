"""Generate the deterministic sample ONNX models used by Prism's tests, demos and benchmarks.

Usage (from the repository root)::

    .venv/bin/python sample_models/make_samples.py

Writes ``mlp.onnx``, ``cnn.onnx``, ``transformer.onnx``, ``branchy.onnx`` and
``control_flow.onnx`` next to this script, then self-checks every model (ONNX checker with
``full_check``, strict shape inference, and one onnxruntime CPU run at batch 1 and batch 3).
Only ``onnx`` and ``numpy`` are needed to build the models; the self-check also needs
``onnxruntime``. The output is byte-identical from run to run (fixed seed, no timestamps).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT_DIR = Path(__file__).parent
SEED = 20240917
IR_VERSION = 9
OPSET = 17
BATCH = "batch"
PRODUCER = "prism-make-samples"


class GraphBuilder:
    """Tiny helper that keeps node names unique and weights as float32 initializers."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate name {name!r}")
        self._names.add(name)
        return name

    # -- initializers -------------------------------------------------------------------
    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), self._claim(name)))
        return name

    def weight(self, name: str, shape: Sequence[int], fan_in: int, gain: float = 2.0) -> str:
        """He-style (gain=2) or Xavier-style (gain=1) normal init, float32."""
        std = math.sqrt(gain / fan_in)
        w = (self.rng.standard_normal(tuple(shape)) * std).astype(np.float32)
        return self.const(name, w)

    def bias(self, name: str, size: int, scale: float = 0.01) -> str:
        b = (self.rng.standard_normal(size) * scale).astype(np.float32)
        return self.const(name, b)

    def scalar(self, name: str, value: float) -> str:
        return self.const(name, np.array(value, dtype=np.float32))

    # -- nodes ----------------------------------------------------------------------------
    def node(
        self,
        op: str,
        inputs: Sequence[str],
        name: str,
        output: str | None = None,
        **attrs: object,
    ) -> str:
        """Add a single-output node; its output tensor is named after the node by default."""
        if output is None:
            output = self._claim(name)
        else:
            self._claim(name)
            self._claim(output)
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))
        return output

    def conv(
        self,
        x: str,
        name: str,
        c_in: int,
        c_out: int,
        k: int,
        stride: int = 1,
        gain: float = 2.0,
        bias: bool = True,
    ) -> str:
        w = self.weight(f"{name}.weight", (c_out, c_in, k, k), c_in * k * k, gain)
        inputs = [x, w]
        if bias:
            inputs.append(self.bias(f"{name}.bias", c_out))
        pad = k // 2
        return self.node(
            "Conv",
            inputs,
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
        )

    def batchnorm(self, x: str, name: str, channels: int) -> str:
        rng = self.rng
        scale = (1.0 + 0.1 * rng.standard_normal(channels)).astype(np.float32)
        shift = (0.05 * rng.standard_normal(channels)).astype(np.float32)
        mean = (0.05 * rng.standard_normal(channels)).astype(np.float32)
        var = (1.0 + 0.2 * rng.random(channels)).astype(np.float32)
        inputs = [
            self.const(f"{name}.scale", scale),
            self.const(f"{name}.bias", shift),
            self.const(f"{name}.running_mean", mean),
            self.const(f"{name}.running_var", var),
        ]
        return self.node("BatchNormalization", [x, *inputs], name, epsilon=1e-5)

    def gemm(
        self,
        x: str,
        name: str,
        n_in: int,
        n_out: int,
        gain: float = 2.0,
        output: str | None = None,
    ) -> str:
        """PyTorch-style Linear: weight [out, in], transB=1."""
        w = self.weight(f"{name}.weight", (n_out, n_in), n_in, gain)
        b = self.bias(f"{name}.bias", n_out)
        return self.node("Gemm", [x, w, b], name, output=output, transB=1)

    def linear(self, x: str, name: str, n_in: int, n_out: int, gain: float = 1.0) -> str:
        """MatMul + Add (how transformer exporters emit projections on 3-D inputs)."""
        w = self.weight(f"{name}.weight", (n_in, n_out), n_in, gain)
        b = self.bias(f"{name}.bias", n_out)
        mm = self.node("MatMul", [x, w], f"{name}/matmul")
        return self.node("Add", [mm, b], f"{name}/add")

    def layernorm(self, x: str, name: str, size: int) -> str:
        gamma = (1.0 + 0.05 * self.rng.standard_normal(size)).astype(np.float32)
        beta = (0.02 * self.rng.standard_normal(size)).astype(np.float32)
        g = self.const(f"{name}.weight", gamma)
        b = self.const(f"{name}.bias", beta)
        return self.node("LayerNormalization", [x, g, b], name, axis=-1, epsilon=1e-5)

    # -- model ----------------------------------------------------------------------------
    def model(
        self,
        graph_name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        doc: str,
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, graph_name, list(inputs), list(outputs), initializer=self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        model.model_version = 1
        return model


def tensor(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


# ----------------------------------------------------------------------------------------
# 1. MLP
# ----------------------------------------------------------------------------------------
def build_mlp(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    dims = [256, 512, 512, 256, 10]
    h = "x"
    n_layers = len(dims) - 1
    for i, (n_in, n_out) in enumerate(itertools.pairwise(dims), start=1):
        last = i == n_layers
        if last:
            g.gemm(h, "head/fc", n_in, n_out, gain=1.0, output="logits")
        else:
            h = g.node("Relu", [g.gemm(h, f"fc{i}", n_in, n_out)], f"fc{i}/relu")
    return g.model(
        "mlp",
        [tensor("x", [BATCH, 256])],
        [tensor("logits", [BATCH, 10])],
        "4-layer MLP 256-512-512-256-10 with ReLU.",
    )


# ----------------------------------------------------------------------------------------
# 2. ResNet-style CNN
# ----------------------------------------------------------------------------------------
def build_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    h = g.conv("image", "stem/conv", 3, 16, 3, bias=False)
    h = g.batchnorm(h, "stem/bn", 16)
    h = g.node("Relu", [h], "stem/relu")
    c_in = 16
    for s, c_out in enumerate([16, 32, 64], start=1):
        for b in (1, 2):
            p = f"stage{s}/block{b}"
            stride = 2 if (s > 1 and b == 1) else 1
            skip = h
            if stride != 1 or c_in != c_out:
                skip = g.conv(h, f"{p}/proj", c_in, c_out, 1, stride=stride, gain=1.0)
            y = g.conv(h, f"{p}/conv1", c_in, c_out, 3, stride=stride, bias=False)
            y = g.batchnorm(y, f"{p}/bn1", c_out)
            y = g.node("Relu", [y], f"{p}/relu1")
            # Down-scaled second conv keeps the residual stream from blowing up.
            y = g.conv(y, f"{p}/conv2", c_out, c_out, 3, gain=0.5)
            y = g.node("Add", [y, skip], f"{p}/add")
            h = g.node("Relu", [y], f"{p}/relu2")
            c_in = c_out
    h = g.node("GlobalAveragePool", [h], "head/gap")
    h = g.node("Flatten", [h], "head/flatten", axis=1)
    g.gemm(h, "head/fc", 64, 10, gain=1.0, output="logits")
    return g.model(
        "cnn",
        [tensor("image", [BATCH, 3, 32, 32])],
        [tensor("logits", [BATCH, 10])],
        "ResNet-style CNN: stem + 3 stages x 2 residual blocks (16/32/64 ch), 10 classes.",
    )


# ----------------------------------------------------------------------------------------
# 3. Transformer encoder
# ----------------------------------------------------------------------------------------
SEQ, HIDDEN, HEADS, FFN = 16, 64, 4, 256
HEAD_DIM = HIDDEN // HEADS


def build_transformer(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    # Shared constants (Reshape's 0 copies the input's batch dim, so batch stays dynamic).
    to_heads = g.const("const/to_heads_shape", np.array([0, SEQ, HEADS, HEAD_DIM], np.int64))
    to_hidden = g.const("const/to_hidden_shape", np.array([0, SEQ, HIDDEN], np.int64))
    inv_sqrt_d = g.scalar("const/inv_sqrt_head_dim", 1.0 / math.sqrt(HEAD_DIM))
    inv_sqrt2 = g.scalar("const/inv_sqrt2", 1.0 / math.sqrt(2.0))
    one = g.scalar("const/one", 1.0)
    half = g.scalar("const/half", 0.5)

    h = "tokens"
    for blk in (1, 2):
        p = f"block{blk}"
        a = f"{p}/attn"
        x = g.layernorm(h, f"{p}/ln1", HIDDEN)
        heads = {}
        for proj, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            t = g.linear(x, f"{a}/{proj}_proj", HIDDEN, HIDDEN)
            t = g.node("Reshape", [t, to_heads], f"{a}/{proj}_reshape")
            # K is transposed straight to [b, heads, head_dim, seq] (i.e. K^T).
            heads[proj] = g.node("Transpose", [t], f"{a}/{proj}_transpose", perm=perm)
        s = g.node("MatMul", [heads["q"], heads["k"]], f"{a}/scores")
        s = g.node("Mul", [s, inv_sqrt_d], f"{a}/scale")
        s = g.node("Softmax", [s], f"{a}/softmax", axis=-1)
        c = g.node("MatMul", [s, heads["v"]], f"{a}/context")
        c = g.node("Transpose", [c], f"{a}/merge_transpose", perm=[0, 2, 1, 3])
        c = g.node("Reshape", [c, to_hidden], f"{a}/merge_reshape")
        c = g.linear(c, f"{a}/out_proj", HIDDEN, HIDDEN)
        h = g.node("Add", [h, c], f"{p}/residual1")

        m = f"{p}/ffn"
        x = g.layernorm(h, f"{p}/ln2", HIDDEN)
        f = g.linear(x, f"{m}/fc1", HIDDEN, FFN, gain=2.0)
        # GELU(x) = x * 0.5 * (1 + erf(x / sqrt(2)))
        e = g.node("Mul", [f, inv_sqrt2], f"{m}/gelu/div_sqrt2")
        e = g.node("Erf", [e], f"{m}/gelu/erf")
        e = g.node("Add", [e, one], f"{m}/gelu/add_one")
        e = g.node("Mul", [f, e], f"{m}/gelu/mul_x")
        e = g.node("Mul", [e, half], f"{m}/gelu/mul_half")
        f = g.linear(e, f"{m}/fc2", FFN, HIDDEN)
        h = g.node("Add", [h, f], f"{p}/residual2")

    gamma = g.const("final_ln.weight", np.ones(HIDDEN, np.float32))
    beta = g.const("final_ln.bias", np.zeros(HIDDEN, np.float32))
    g.node(
        "LayerNormalization", [h, gamma, beta], "final_ln", output="hidden", axis=-1, epsilon=1e-5
    )
    return g.model(
        "transformer",
        [tensor("tokens", [BATCH, SEQ, HIDDEN])],
        [tensor("hidden", [BATCH, SEQ, HIDDEN])],
        "Two pre-LN transformer encoder blocks (seq 16, hidden 64, 4 heads, FFN 256, GELU).",
    )


# ----------------------------------------------------------------------------------------
# 4. Inception-style branchy net
# ----------------------------------------------------------------------------------------
def inception(
    g: GraphBuilder,
    x: str,
    p: str,
    c_in: int,
    c1: int,
    c3: tuple[int, int],
    c5: tuple[int, int],
    cp: int,
) -> tuple[str, int]:
    b1 = g.node("Relu", [g.conv(x, f"{p}/b1x1/conv", c_in, c1, 1)], f"{p}/b1x1/relu")

    t = g.node("Relu", [g.conv(x, f"{p}/b3x3/reduce", c_in, c3[0], 1)], f"{p}/b3x3/reduce_relu")
    b3 = g.node("Relu", [g.conv(t, f"{p}/b3x3/conv", c3[0], c3[1], 3)], f"{p}/b3x3/relu")

    t = g.node("Relu", [g.conv(x, f"{p}/b5x5/reduce", c_in, c5[0], 1)], f"{p}/b5x5/reduce_relu")
    b5 = g.node("Relu", [g.conv(t, f"{p}/b5x5/conv", c5[0], c5[1], 5)], f"{p}/b5x5/relu")

    t = g.node(
        "MaxPool",
        [x],
        f"{p}/pool/maxpool",
        kernel_shape=[3, 3],
        strides=[1, 1],
        pads=[1, 1, 1, 1],
    )
    bp = g.node("Relu", [g.conv(t, f"{p}/pool/proj", c_in, cp, 1)], f"{p}/pool/relu")

    out = g.node("Concat", [b1, b3, b5, bp], f"{p}/concat", axis=1)
    return out, c1 + c3[1] + c5[1] + cp


def build_branchy(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    h = g.node("Relu", [g.conv("image", "stem/conv", 8, 16, 3)], "stem/relu")
    h, c = inception(g, h, "inception1", 16, 8, (8, 16), (4, 8), 8)  # -> 40 ch
    h, c = inception(g, h, "inception2", c, 16, (16, 24), (8, 16), 8)  # -> 64 ch
    h = g.node("GlobalAveragePool", [h], "head/gap")
    h = g.node("Flatten", [h], "head/flatten", axis=1)
    g.gemm(h, "head/fc", c, 10, gain=1.0, output="logits")
    return g.model(
        "branchy",
        [tensor("image", [BATCH, 8, 16, 16])],
        [tensor("logits", [BATCH, 10])],
        "Inception-style net: stem conv + 2 four-branch inception modules, 10 classes.",
    )


# ----------------------------------------------------------------------------------------
# 5. Control flow (If with outer-scope reads)
# ----------------------------------------------------------------------------------------
CF_IN, CF_HIDDEN, CF_OUT = 32, 64, 16
CF_ELSE_SCALE = 0.5


def build_control_flow(rng: np.random.Generator) -> onnx.ModelProto:
    g = GraphBuilder(rng)
    h = g.gemm("x", "fc1", CF_IN, CF_HIDDEN)
    h = g.node("Relu", [h], "fc1/relu")  # tensor "fc1/relu" is `h`

    total = g.node("ReduceSum", ["x"], "cond/reduce_sum", keepdims=0)
    zero = g.scalar("cond/zero", 0.0)
    cond = g.node("Greater", [total, zero], "cond/greater")

    # Outer-scope initializers read by the branches.
    w_then = g.weight("if/then.weight", (CF_HIDDEN, CF_OUT), CF_HIDDEN)
    w_else = g.weight("if/else.weight", (CF_HIDDEN, CF_OUT), CF_HIDDEN)
    scale = g.scalar("if/else.scale", CF_ELSE_SCALE)
    out_bias = g.bias("out.bias", CF_OUT, scale=0.1)

    then_graph = helper.make_graph(
        [helper.make_node("MatMul", [h, w_then], ["then_out"], name="if/then/matmul")],
        "then_branch",
        [],
        [tensor("then_out", [BATCH, CF_OUT])],
    )
    else_graph = helper.make_graph(
        [
            helper.make_node("Mul", [h, scale], ["else_scaled"], name="if/else/mul"),
            helper.make_node(
                "MatMul", ["else_scaled", w_else], ["else_out"], name="if/else/matmul"
            ),
        ],
        "else_branch",
        [],
        [tensor("else_out", [BATCH, CF_OUT])],
    )
    z = g.node("If", [cond], "if", then_branch=then_graph, else_branch=else_graph)
    y = g.node("Add", [z, out_bias], "out/add")
    g.node("Relu", [y], "out/relu", output="y")
    return g.model(
        "control_flow",
        [tensor("x", [BATCH, CF_IN])],
        [tensor("y", [BATCH, CF_OUT])],
        "Gemm+Relu, then If(sum(x) > 0) whose branches read outer-scope h and weights.",
    )


def control_flow_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0.0)
    then_z = h @ w["if/then.weight"]
    else_z = (h * w["if/else.scale"]) @ w["if/else.weight"]
    z = then_z if x.sum() > 0 else else_z
    return np.maximum(z + w["out.bias"], 0.0)


# ----------------------------------------------------------------------------------------
# Self-check
# ----------------------------------------------------------------------------------------
MODELS: list[tuple[str, Callable[[np.random.Generator], onnx.ModelProto]]] = [
    ("mlp", build_mlp),
    ("cnn", build_cnn),
    ("transformer", build_transformer),
    ("branchy", build_branchy),
    ("control_flow", build_control_flow),
]


def _count_nodes(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        n += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                n += _count_nodes(attr.g)
    return n


def check_shapes(model: onnx.ModelProto) -> None:
    """Strict shape inference must give every top-level tensor a full (symbolic-batch) shape."""
    inferred = onnx.shape_inference.infer_shapes(
        model, check_type=True, strict_mode=True, data_prop=True
    )
    g = inferred.graph
    infos = {vi.name: vi for vi in [*g.value_info, *g.input, *g.output]}
    for node in g.node:
        for out in node.output:
            vi = infos.get(out)
            assert vi is not None, f"{model.graph.name}: no inferred type for {out!r}"
            tt = vi.type.tensor_type
            assert tt.elem_type != TensorProto.UNDEFINED, f"{out!r}: unknown elem type"
            assert tt.HasField("shape"), f"{model.graph.name}: unknown rank for {out!r}"
            for d in tt.shape.dim:
                assert d.HasField("dim_value") or d.HasField("dim_param"), (
                    f"{model.graph.name}: unknown dim in {out!r}: {tt.shape}"
                )


def run_model(path: Path, model: onnx.ModelProto, rng: np.random.Generator) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    static = list(inp.shape[1:])
    for batch in (1, 3):
        feeds = [rng.standard_normal((batch, *static)).astype(np.float32)]
        if model.graph.name == "control_flow":
            base = np.abs(feeds[0])
            feeds = [base, -base]  # positive sum -> then branch, negative sum -> else branch
        for x in feeds:
            outs = sess.run(None, {inp.name: x})
            for o in outs:
                assert o.shape[0] == batch, (path.name, o.shape)
                assert np.all(np.isfinite(o)), f"{path.name}: non-finite output"
                assert float(np.abs(o).max()) > 0.0, f"{path.name}: all-zero output"
            if model.graph.name == "control_flow":
                ref = control_flow_reference(model, x)
                np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)


def main() -> None:
    rng = np.random.default_rng(SEED)
    total = 0
    for name, build in MODELS:
        model = build(rng)
        onnx.checker.check_model(model, full_check=True)
        check_shapes(model)
        path = OUT_DIR / f"{name}.onnx"
        data = model.SerializeToString()
        path.write_bytes(data)
        total += len(data)
        # Inputs for the self-check come from a separate stream so weights never depend on it.
        run_model(path, model, np.random.default_rng(SEED + 1))
        digest = hashlib.sha256(data).hexdigest()[:12]
        print(
            f"{path.name:18s} {len(data) / 1e6:6.3f} MB  {_count_nodes(model.graph):4d} nodes"
            f"  sha256={digest}"
        )
    print(f"{'total':18s} {total / 1e6:6.3f} MB")


if __name__ == "__main__":
    main()
