"""Optimizers as ai.onnx graphs a stage's device runs on its own resident weights: SGD,
SGD with momentum and Adam, each as PyTorch defines it (no weight decay, no dampening, no
Nesterov; Adam's bias correction as `torch.optim.Adam`).

    sgd:      w -= lr * g
    momentum: v = mu * v + g;  w -= lr * v
    adam:     t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
              w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

`g` is the gradient accumulated over the step's micro-batches (already the gradient of the
batch's mean loss); the update also zeroes it for the next step. The learning rate is an
input (`LR`), so a schedule may change it between steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from onnx.helper import np_dtype_to_tensor_dtype

from runtime.errors import TrainingError
from runtime.train.choices import OPTIMIZERS
from runtime.train.emit import Emitter

LR = "train/lr"


def accumulator(weight: str) -> str:
    return f"acc/{weight}"


def scalar_dtype(weights: Mapping[str, np.ndarray]) -> np.dtype:
    """What the learning rate and Adam's step count are held in: the widest of float32 and
    the parameters' dtypes (weights of a dimension or more; float16 counts no further than
    2048 steps), cast to a narrower parameter's dtype where its step is taken."""
    return max((np.dtype(np.float32), *(v.dtype for v in weights.values() if v.ndim)),
               key=lambda d: d.itemsize)


@dataclass(frozen=True)
class Optimizer:
    kind: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise TrainingError(f"unknown optimizer {self.kind!r}; choose "
                                f"{', '.join(OPTIMIZERS)}")
        if not 0 < self.lr < float("inf"):
            raise TrainingError(f"learning rate must be positive and finite, got {self.lr}")

    def state(self, weight: str, value: np.ndarray) -> dict[str, np.ndarray]:
        """The resident tensors a weight needs besides itself: its gradient accumulator
        and the optimizer's state, all zeros to start."""
        names = {"sgd": [], "momentum": ["velocity"], "adam": ["m", "v"]}[self.kind]
        return {accumulator(weight): np.zeros_like(value),
                **{f"{n}/{weight}": np.zeros_like(value) for n in names}}

    def step_counter(self, stage: int, dtype: np.dtype) -> dict[str, np.ndarray]:
        """Adam's step count t, one per stage, resident with its weights."""
        return {f"adam/t/{stage}": np.zeros((), dtype)} if self.kind == "adam" else {}

    def write(self, e: Emitter, weights: dict[str, np.dtype], stage: int,
              shapes: dict[str, tuple[int, ...]], scalar: np.dtype) -> list[tuple[str, str]]:
        """Nodes updating every weight of a stage; the (output, resident tensor) pairs
        they write back. `scalar`: the learning rate's and step count's dtype
        (`scalar_dtype`)."""
        writes: list[tuple[str, str]] = []
        casts: dict[tuple[str, np.dtype], str] = {}

        def held(name: str, wt: np.dtype) -> str:
            """`name`, a `scalar` value, in `wt` (cast once per dtype)."""
            if wt == scalar:
                return name
            if (name, wt) not in casts:
                casts[name, wt] = e.op("Cast", [name], to=np_dtype_to_tensor_dtype(wt))
            return casts[name, wt]

        t = f"adam/t/{stage}"
        if self.kind == "adam":
            t_next = e.op("Add", [t, e.const(1, scalar)])
            writes.append((t_next, t))
            fix1 = e.op("Sub", [e.const(1, scalar), e.op("Pow", [e.const(self.beta1, scalar),
                                                                  t_next])])
            fix2 = e.op("Sub", [e.const(1, scalar), e.op("Pow", [e.const(self.beta2, scalar),
                                                                  t_next])])
        for w, wt in weights.items():
            g, lr = accumulator(w), held(LR, wt)

            def c(v: float, wt: np.dtype = wt) -> str:
                return e.const(v, wt)

            if self.kind == "sgd":
                step = e.op("Mul", [g, lr])
            elif self.kind == "momentum":
                velocity = f"velocity/{w}"
                v_next = e.op("Add", [e.op("Mul", [velocity, c(self.momentum)]), g])
                writes.append((v_next, velocity))
                step = e.op("Mul", [v_next, lr])
            else:
                m, v = f"m/{w}", f"v/{w}"
                m_next = e.op("Add", [e.op("Mul", [m, c(self.beta1)]),
                                      e.op("Mul", [g, c(1 - self.beta1)])])
                v_next = e.op("Add", [e.op("Mul", [v, c(self.beta2)]),
                                      e.op("Mul", [e.op("Mul", [g, g]), c(1 - self.beta2)])])
                writes += [(m_next, m), (v_next, v)]
                m_hat = e.op("Div", [m_next, held(fix1, wt)])
                denom = e.op("Add", [e.op("Sqrt", [e.op("Div", [v_next, held(fix2, wt)])]),
                                     c(self.eps)])
                step = e.op("Mul", [e.op("Div", [m_hat, denom]), lr])
            writes.append((e.op("Sub", [w, step]), w))
            writes.append((e.expand(c(0), shapes[w]), g))
        return writes
