"""Training: gradients of ONNX graphs written as ai.onnx ops, and a training step pipelined
over the host's devices.

    grads = gradients("model.onnx", {"x": x}, labels, loss="cross_entropy")

Names load on first use (PEP 562).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_names

if TYPE_CHECKING:  # the names as mypy and readers see them
    from runtime.train.batch_gradients import gradients, loss_and_gradients  # noqa: F401

_EXPORTS = {
    "gradients": "runtime.train.batch_gradients",
    "loss_and_gradients": "runtime.train.batch_gradients",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_names(__name__, _EXPORTS)
