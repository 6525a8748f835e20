"""Modules the torch tests compile, an operator ONNX cannot express, and checks.

`prism_tests::mystery` is a custom operator (sin, doubled) with no ONNX translation: a
module calling it in its middle must run it in PyTorch and offload the rest.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from runtime.observe.events import Subscription


@torch.library.custom_op("prism_tests::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _mystery_backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    (x,) = ctx.saved_tensors
    return grad * x.cos() * 2


def _mystery_saves(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    ctx.save_for_backward(inputs[0])


mystery.register_autograd(_mystery_backward, setup_context=_mystery_saves)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32),
                                 nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3),
                                      nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16 * 2 * 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1)).softmax(-1)


class LSTM(nn.Module):
    """Dynamo traces recurrent modules only with `torch._dynamo.config.allow_rnn`."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(6, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class Mystery(nn.Module):
    """Linear layers around an operator ONNX cannot express."""

    def __init__(self) -> None:
        super().__init__()
        self.before = nn.Sequential(nn.Linear(10, 24), nn.Tanh())
        self.after = nn.Sequential(nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(mystery(self.before(x)))


def encoder() -> nn.Module:
    """A small transformer encoder block (in eval mode without gradients PyTorch runs it
    as one fused operator, which the backend writes out again)."""
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)


# name -> (make the module, the shape of one input row)
MODULES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (MLP, (12,)), "cnn": (CNN, (3, 8, 8)), "encoder": (encoder, (5, 16)),
    "lstm": (LSTM, (7, 6)), "mystery": (Mystery, (10,)),
}


def fresh_weights() -> None:
    """Seed PyTorch's generator afresh, so modules made next start from new weights."""
    torch.manual_seed(int(np.random.default_rng().integers(2**62)))


def fresh(*shape: int) -> torch.Tensor:
    """Random float32 values, new on every run."""
    return torch.from_numpy(np.random.default_rng().standard_normal(shape, dtype=np.float32))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def finished_runs(subscription: Subscription) -> dict[str, int]:
    """network -> partition runs finished, among the events not drained yet."""
    counts: dict[str, int] = {}
    for event in subscription.drain():
        if event.kind == "partition.run.finished" and event.get("ok", True):
            counts[event["network"]] = counts.get(event["network"], 0) + 1
    return counts
