"""The loss a training graph ends in, written as ai.onnx nodes after the prediction, and the
labels it reads, checked and cast.

Both losses are PyTorch's defaults: `cross_entropy` is `F.cross_entropy` (logits with the
classes on axis 1, integer class labels, the mean over every labelled position; a position
labelled IGNORED, its ignore_index, counts for nothing), written as one
SoftmaxCrossEntropyLoss node; `mse` is `F.mse_loss` (the mean over every element),
written as Sub, Mul and ReduceMean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime.errors import TrainingError
from runtime.inputs import array_text
from runtime.train.choices import LOSSES
from runtime.train.emit import Emitter, Shape

LABELS = "train/labels"  # the training graph's input holding the labels
LOSS_ORIGIN = "loss"  # what the loss nodes serve (the stage of the prediction runs them)
IGNORED = -100  # F.cross_entropy's default ignore_index (padding in a sequence's labels)


@dataclass(frozen=True)
class Loss:
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in LOSSES:
            raise TrainingError(f"unknown loss {self.kind!r}; choose {' or '.join(LOSSES)}")

    def classes_last(self, labels: object, prediction: Shape) -> bool:
        """Are these class labels a language model's token labels, [batch, tokens] for
        logits [batch, tokens, vocabulary], as transformers' models take them: the classes
        on the last axis, where PyTorch's cross_entropy (and a shape that fits it too)
        has them second?"""
        shape = np.asarray(labels).shape
        return self.kind == "cross_entropy" and len(prediction) > 2 and \
            shape == tuple(prediction[:-1]) != (prediction[0], *prediction[2:])

    def labels(self, labels: object, prediction: Shape, dtype: np.dtype, what: str
               ) -> np.ndarray:
        """`labels` as the loss reads them, or one line saying why they do not fit a
        prediction of this shape and dtype (`what` names where they came from)."""
        if isinstance(labels, Mapping):  # as feeds are given: by name
            raise TrainingError(f"{what}: give one array of targets for the model's first "
                                f"output, not a mapping (of {', '.join(map(str, labels))})")
        array = np.asarray(labels)
        if self.kind == "cross_entropy":
            return self._classes(array, _classes_second(prediction) if self.classes_last(
                array, prediction) else prediction, what)
        if array.dtype.kind != "f":
            raise TrainingError(f"{what}: mse takes float targets, got {array_text(array)}")
        if tuple(array.shape) != tuple(prediction):
            raise TrainingError(f"{what}: mse targets must have the prediction's shape "
                                f"{list(prediction)}, got {list(array.shape)}")
        return array.astype(dtype, copy=False)

    def counted(self, labels: np.ndarray) -> int:
        """How many terms the loss's mean over these labels has (positions not IGNORED,
        or elements): micro-batches' losses weigh by it to make the batch's mean."""
        if self.kind == "cross_entropy":
            return int(np.count_nonzero(labels != IGNORED))
        return int(labels.size)

    def _classes(self, array: np.ndarray, prediction: Shape, what: str) -> np.ndarray:
        if len(prediction) < 2:
            raise TrainingError(f"{what}: cross_entropy needs logits of rank 2 or more "
                                f"(batch, classes, ...), the model gives {list(prediction)}")
        if array.dtype.kind not in "iu":
            raise TrainingError(f"{what}: cross_entropy takes integer class labels, got "
                                f"{array_text(array)}")
        want = (prediction[0], *prediction[2:])
        if tuple(array.shape) != want:
            raise TrainingError(f"{what}: labels must have shape {list(want)} for logits "
                                f"{list(prediction)}, got {list(array.shape)}")
        classes, counted = prediction[1], array[array != IGNORED]
        if counted.size and (counted.min() < 0 or counted.max() >= classes):
            bad = counted.min() if counted.min() < 0 else counted.max()
            raise TrainingError(f"{what}: label {int(bad)} is outside the {classes} classes "
                                f"of the logits")
        return array.astype(np.int64, copy=False)

    def write(self, e: Emitter, prediction: str, rank: int, out: str,
              classes_last: bool = False) -> None:
        """Nodes computing the loss of `prediction` (of `rank`) against LABELS into `out`
        (`classes_last`: a language model's logits, moved to have them second)."""
        with e.serving(LOSS_ORIGIN):
            if self.kind == "cross_entropy":
                if classes_last:
                    prediction = e.op("Transpose", [prediction],
                                      perm=[0, rank - 1, *range(1, rank - 1)])
                e.ops("SoftmaxCrossEntropyLoss", [prediction, LABELS], [out],
                      reduction="mean", ignore_index=IGNORED)
                return
            diff = e.op("Sub", [prediction, LABELS])
            square = e.op("Mul", [diff, diff])
            e.reduce("ReduceMean", square, list(range(rank)), keepdims=False, out=out)


def _classes_second(prediction: Shape) -> Shape:
    """[batch, ..., classes] as [batch, classes, ...]."""
    return (prediction[0], prediction[-1], *prediction[1:-1])
