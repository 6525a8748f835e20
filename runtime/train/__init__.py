"""Training: gradients of ONNX graphs written as ai.onnx ops, and a training step pipelined
over the host's devices (docs/architecture.md, "Training").

    grads = gradients("model.onnx", {"x": x}, labels, loss="cross_entropy")
    with Trainer("model.onnx", data, labels, parse_devices("sim:4"),
                 TrainConfig(optimizer=Optimizer("adam", 1e-3), micro_batches=8)) as t:
        result = t.run(); onnx.save(t.trained_model(), "trained.onnx")

Names load on first use (PEP 562).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.train.batch_gradients import gradients, loss_and_gradients  # noqa: F401
    from runtime.train.optimizers import Optimizer  # noqa: F401
    from runtime.train.trainer import TrainConfig, Trainer, TrainResult  # noqa: F401

_EXPORTS = {
    "gradients": "runtime.train.batch_gradients",
    "loss_and_gradients": "runtime.train.batch_gradients",
    "Optimizer": "runtime.train.optimizers",
    "TrainConfig": "runtime.train.trainer", "Trainer": "runtime.train.trainer",
    "TrainResult": "runtime.train.trainer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
