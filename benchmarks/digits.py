"""A small real classifier: scikit-learn's digits (ships with it, no download), an MLP
trained in about a second and written out as ONNX, with its train and test splits.

Used by the quantization tests and benchmark so accuracy is measured on real labels.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Digits:
    model: onnx.ModelProto  # pixels [batch, 64] float32 -> logits [batch, 10]
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def accuracy(self, logits: np.ndarray) -> float:
        return float(np.mean(logits.argmax(1) == self.test_y))


def to_onnx(coefs: list[np.ndarray], biases: list[np.ndarray]) -> onnx.ModelProto:
    """Gemm layers with Relu between them, as scikit-learn's MLPClassifier computes."""
    nodes, inits, x = [], [], "pixels"
    for i, (w, b) in enumerate(zip(coefs, biases, strict=True)):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        y = "logits" if i == len(coefs) - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], name=f"fc{i}"))
        if y != "logits":
            nodes.append(helper.make_node("Relu", [y], [f"{y}_relu"], name=f"relu{i}"))
            y = f"{y}_relu"
        x = y
    graph = helper.make_graph(
        nodes, "digits", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT,
                                                        ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def digits_classifier(hidden: tuple[int, ...] = (64, 32), seed: int = 0) -> Digits:
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.25, random_state=seed,
                                                        stratify=y)
    mlp = MLPClassifier(hidden, max_iter=200, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(train_x, train_y)
    return Digits(to_onnx(mlp.coefs_, mlp.intercepts_), train_x, train_y, test_x, test_y)
