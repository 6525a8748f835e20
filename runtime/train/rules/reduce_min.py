"""ReduceMin: see `_reduce.to_reduced_extremes`."""

from runtime.train.registry import gradient
from runtime.train.rules._reduce import to_reduced_extremes

gradient("ReduceMin")(to_reduced_extremes)
