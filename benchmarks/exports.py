"""Models shaped as PyTorch's legacy exporter (`torch.onnx.export(..., dynamo=False)`) leaves
them, built with onnx.helper (torch is not installed here): a BERT encoder whose LayerNorm
and bias weights sit behind `Identity` nodes over initializers, shapes held in `Constant`
nodes, LayerNorm and GELU spelled out op by op.

    model = legacy_bert(layers=4, hidden=256, heads=4, seq=128)

Used by the planning benchmark (`benchmarks/plans.py`) and by the tests of constant
folding, at sizes the repository's committed models do not have.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 14


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.prologue: list[onnx.NodeProto] = []  # Identity over parameters: the graph's top
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, op: str) -> str:
        self.count += 1
        return f"/{op}_{self.count}"

    def op(self, op: str, inputs: list[str], **attrs: object) -> str:
        name = self._name(op)
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], scale: float = 0.05) -> str:
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.init(name, value)

    def behind_identity(self, name: str, value: np.ndarray) -> str:
        """A parameter as the legacy exporter often leaves it: an Identity over it, at the
        top of the graph (so cutting the model order anywhere leaves weights on one side
        and their readers on the other)."""
        self.init(name, value)
        out = f"onnx::Identity_{len(self.prologue)}"
        self.prologue.append(helper.make_node("Identity", [name], [out],
                                              name=f"/Identity_{len(self.prologue)}"))
        return out

    def constant(self, value: np.ndarray) -> str:
        name = self._name("Constant")
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node("Constant", [], [out], name=name,
                                           value=numpy_helper.from_array(value)))
        return out

    def layer_norm(self, x: str, prefix: str, hidden: int) -> str:
        mean = self.op("ReduceMean", [x], axes=[-1])
        centred = self.op("Sub", [x, mean])
        square = self.op("Pow", [centred, self.constant(np.array(2.0, np.float32))])
        var = self.op("ReduceMean", [square], axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.constant(np.array(1e-12, np.float32))])])
        normed = self.op("Div", [centred, std])
        gamma = self.behind_identity(f"{prefix}.weight", np.ones(hidden, np.float32))
        beta = self.behind_identity(f"{prefix}.bias", np.zeros(hidden, np.float32))
        return self.op("Add", [self.op("Mul", [normed, gamma]), beta])

    def linear(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        w = self.weight(f"onnx::MatMul_{prefix}", (n_in, n_out), 1 / np.sqrt(n_in))
        bias = self.behind_identity(f"{prefix}.bias", (self.rng.standard_normal(n_out)
                                                        * 0.01).astype(np.float32))
        return self.op("Add", [self.op("MatMul", [x, w]), bias])

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", [self.op("Div", [x, self.constant(np.array(1.4142135, np.float32))])])
        plus = self.op("Add", [erf, self.constant(np.array(1.0, np.float32))])
        return self.op("Mul", [self.op("Mul", [x, plus]), self.constant(np.array(0.5, np.float32))])


def legacy_bert(layers: int = 4, hidden: int = 256, heads: int = 4, seq: int = 128,
                vocab: int = 1000, seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """A BERT encoder and pooler at a fixed sequence length, as the legacy exporter writes
    one: inputs `input_ids` and `attention_mask` (int64 [batch, seq]), outputs
    `last_hidden_state` and `pooler_output`. `batch`: 1, as the exporter traced it, or a
    name for a dynamic batch (its reshapes then keep the batch dimension as it comes)."""
    b = _Builder(seed)
    head = hidden // heads
    word = b.weight("m.embeddings.word_embeddings.weight", (vocab, hidden))
    position = b.weight("m.embeddings.position_embeddings.weight", (seq, hidden))
    positions = b.init("m.embeddings.position_ids", np.arange(seq, dtype=np.int64)[None])
    x = b.op("Add", [b.op("Gather", [word, "input_ids"]),
                     b.op("Gather", [position, positions])])
    x = b.layer_norm(x, "m.embeddings.LayerNorm", hidden)
    mask = b.op("Unsqueeze", [b.op("Unsqueeze", ["attention_mask", b.constant(
        np.array([1], np.int64))]), b.constant(np.array([2], np.int64))])
    mask = b.op("Cast", [mask], to=TensorProto.FLOAT)
    mask = b.op("Mul", [b.op("Sub", [b.constant(np.array(1.0, np.float32)), mask]),
                        b.constant(np.array(-10000.0, np.float32))])
    rows = 0 if isinstance(batch, str) else batch  # Reshape's 0: the batch as it comes
    split = b.constant(np.array([rows, seq, heads, head], np.int64))
    merge = b.constant(np.array([rows, seq, hidden], np.int64))
    scale = b.constant(np.array(np.sqrt(head), np.float32))
    for i in range(layers):
        p = f"m.encoder.layer.{i}"

        def heads_of(t: str) -> str:
            return b.op("Transpose", [b.op("Reshape", [t, split])], perm=[0, 2, 1, 3])

        q = heads_of(b.linear(x, f"{p}.attention.self.query", hidden, hidden))
        k = heads_of(b.linear(x, f"{p}.attention.self.key", hidden, hidden))
        v = heads_of(b.linear(x, f"{p}.attention.self.value", hidden, hidden))
        scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              scale])
        probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
        context = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [probs, v])],
                                        perm=[0, 2, 1, 3]), merge])
        attended = b.linear(context, f"{p}.attention.output.dense", hidden, hidden)
        x = b.layer_norm(b.op("Add", [attended, x]), f"{p}.attention.output.LayerNorm", hidden)
        inner = b.gelu(b.linear(x, f"{p}.intermediate.dense", hidden, 4 * hidden))
        out = b.linear(inner, f"{p}.output.dense", 4 * hidden, hidden)
        x = b.layer_norm(b.op("Add", [out, x]), f"{p}.output.LayerNorm", hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"],
                                    name="/last_hidden_state"))
    first = b.op("Gather", [x, b.constant(np.array(0, np.int64))], axis=1)
    pooled = b.op("Tanh", [b.linear(first, "m.pooler.dense", hidden, hidden)])
    b.nodes.append(helper.make_node("Identity", [pooled], ["pooler_output"],
                                    name="/pooler_output"))
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])
    attention = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq])
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                             [batch, seq, hidden]),
               helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT,
                                             [batch, hidden])]
    graph = helper.make_graph(b.prologue + b.nodes, "main_graph", [ids, attention], outputs,
                              b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pytorch")
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def legacy_bert_feeds(model: onnx.ModelProto, seed: int = 0, vocab: int = 1000
                      ) -> dict[str, np.ndarray]:
    """Token ids in the vocabulary and a mask of ones, at the model's fixed shape."""
    seq = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, vocab, (1, seq), dtype=np.int64),
            "attention_mask": np.ones((1, seq), np.int64)}
