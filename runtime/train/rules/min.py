"""Min (elementwise, any number of operands): see `_extremes`."""

from runtime.train.registry import gradient
from runtime.train.rules._extremes import to_extremes

gradient("Min")(to_extremes)
