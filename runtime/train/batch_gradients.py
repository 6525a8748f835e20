"""`gradients(model, feeds, labels, loss)`: the gradient of the mean loss over one batch,
for every float initializer of an ONNX model.

    grads = gradients("cnn.onnx", {"image": x}, y, loss="cross_entropy")
    grads["conv1.weight"]          # numpy, the initializer's shape and dtype

The training graph (forward, loss, backward: ai.onnx ops only) runs once on a device of
`backend`: `cpu` (onnxruntime), `reference` (onnx's evaluator), or `auto`, which is
onnxruntime unless it has no kernel for the model's types (float64 Conv, say), then the
reference evaluator. The loss is PyTorch's default reduction (`runtime.train.loss`), so
these equal `torch.autograd` on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from runtime.devices.backends import open_device
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Program
from runtime.errors import ProvisionError, TrainingError
from runtime.graph import Graph, load_graph
from runtime.train.forward import LOSS
from runtime.train.loss import Loss
from runtime.train.program import TrainingGraph

BACKENDS = ("auto", "cpu", "reference")
_ROOM = 1 << 40  # the one-off device holds one model: its memory is no limit


def gradients(model: str | Path | onnx.ModelProto | Graph, feeds: Mapping[str, object],
              labels: object, loss: str = "cross_entropy", *, backend: str = "auto"
              ) -> dict[str, np.ndarray]:
    """{initializer name: d(mean loss)/d(initializer)} for every float initializer; an
    initializer the loss does not depend on gets zeros."""
    return loss_and_gradients(model, feeds, labels, loss, backend=backend)[1]


def loss_and_gradients(model: str | Path | onnx.ModelProto | Graph,
                       feeds: Mapping[str, object], labels: object,
                       loss: str = "cross_entropy", *, backend: str = "auto"
                       ) -> tuple[float, dict[str, np.ndarray]]:
    """The batch's mean loss and `gradients`."""
    if backend not in BACKENDS:
        raise TrainingError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    # Unfolded: folding would make new initializers of what constants compute (gradients
    # are asked for the model's own initializers, by their names)
    tg = TrainingGraph.build(load_graph(model, fold=False), feeds, labels, Loss(loss))
    grads = tg.backward.grads
    model = tg.model([LOSS, *dict.fromkeys(g for g in grads.values() if g)])
    reads = {i.name for i in model.graph.input}  # a rewrite may leave a feed unread
    outputs = run_once(model, {k: v for k, v in tg.feeds().items() if k in reads}, backend)
    weights = tg.forward.weights
    out = {}
    for w, value in weights.items():
        grad = grads[w]
        out[w] = np.zeros_like(value) if grad is None else \
            np.asarray(outputs[grad]).astype(value.dtype, copy=False)
    return float(outputs[LOSS]), out


def run_once(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], backend: str
             ) -> dict[str, np.ndarray]:
    """One run of `model` on a device of its own (see the module's docstring)."""
    kinds = ("cpu", "reference") if backend == "auto" else (backend,)
    program = Program.of(model, 0, 0)
    for kind in kinds:
        device = open_device(DeviceConfig(name=f"train-{kind}", backend=kind,
                                          memory_bytes=_ROOM))
        try:
            try:
                device.load("gradients", program)
            except ProvisionError:
                if kind == kinds[-1]:
                    raise
                continue
            outputs = device.run_now("gradients", dict(feeds))
            if outputs is None:  # a fresh device is idle: it never declines
                raise TrainingError(f"{device.name} declined the gradient run")
            return outputs
        finally:
            device.close()
    raise AssertionError("unreachable")
