"""Dropout: trained as in inference (no dropping, as `model.eval()`), so the gradient passes
through unchanged. Its mask output carries none."""

from runtime.train.registry import gradient
from runtime.train.rules._shared import shaped_back

gradient("Dropout")(shaped_back)
