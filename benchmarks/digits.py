"""A small real classifier: scikit-learn's digits (ships with it, no download), an MLP
trained in about a second and written out as ONNX, with its train and test splits; and a
small CNN for the digits as 8x8 images, from a random start, for `prism train`.

Used by the quantization and training tests and benchmarks so accuracy is measured on
real labels.
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


def digits_images(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): [n, 1, 8, 8] float32 in
    [0, 1], a stratified quarter held out."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.25,
                                                        random_state=seed, stratify=y)
    return train_x, train_y, test_x, test_y


def digits_cnn(seed: int = 0, channels: tuple[int, int] = (16, 32)) -> onnx.ModelProto:
    """Conv 3x3, Relu, MaxPool 2, Conv 3x3, Relu, MaxPool 2, Flatten, Gemm: image
    [batch, 1, 8, 8] -> logits [batch, 10], weights drawn as PyTorch initialises them
    (uniform within 1/sqrt(fan in))."""
    rng = np.random.default_rng(seed)
    c1, c2 = channels

    def uniform(fan_in: int, *shape: int) -> np.ndarray:
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    weights = {"conv1.w": uniform(9, c1, 1, 3, 3), "conv1.b": uniform(9, c1),
               "conv2.w": uniform(9 * c1, c2, c1, 3, 3), "conv2.b": uniform(9 * c1, c2),
               "fc.w": uniform(4 * c2, 4 * c2, 10), "fc.b": uniform(4 * c2, 10)}
    mk = helper.make_node
    nodes = [mk("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4, name="conv1"),
             mk("Relu", ["c1"], ["r1"], name="relu1"),
             mk("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             mk("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4, name="conv2"),
             mk("Relu", ["c2"], ["r2"], name="relu2"),
             mk("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
             mk("Flatten", ["p2"], ["flat"], name="flatten"),
             mk("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc")]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
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
