"""CastLike between float types: the gradient is cast back to the input's type."""

from runtime.train.registry import gradient
from runtime.train.rules.cast import cast

gradient("CastLike")(cast)
