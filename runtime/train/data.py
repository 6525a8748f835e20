"""Training data from a file: an .npz holding one array per model input and one of labels,
samples along the first axis (other arrays in it, a test split say, are left alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.errors import TrainingError
from runtime.inputs import read_npz


def read_training_data(path: str | Path, labels: str
                       ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(every array but the labels, the labels); one line naming the file otherwise."""
    arrays = read_npz(path, "training data", TrainingError)
    if labels not in arrays:
        raise TrainingError(f"{path} has no array {labels!r} for the labels; it has "
                            f"{', '.join(sorted(arrays)) or 'none'}")
    return {k: v for k, v in arrays.items() if k != labels}, arrays[labels]
