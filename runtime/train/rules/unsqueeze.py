"""Unsqueeze: the same elements in another shape; the gradient is shaped back."""

from runtime.train.registry import gradient
from runtime.train.rules._shared import shaped_back

gradient("Unsqueeze")(shaped_back)
