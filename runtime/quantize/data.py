"""Calibration data: an .npz with one array per graph input, samples along the first axis.

`image` of shape [N, 3, 32, 32] for a model taking [batch, 3, 32, 32] is N samples. A
model with a fixed first dimension B takes them B at a time (N must be a multiple of B).
An input naming the batch dimension (the name on the inputs' first axes) on another axis
has its samples there: a recurrent state [layers, batch, hidden], as PyTorch lays it out.
An input the model takes as a scalar (a loop's step count, a threshold) is one value,
the same for every run.
Names, dtypes and the other dimensions must match the model's inputs exactly: anything
else is refused in one line naming the file, the input and what the model takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from runtime.errors import PrismError
from runtime.graph import Graph
from runtime.inputs import as_text, input_specs, read_npz

DEFAULT_BATCH = 32  # samples per run where the model's batch dimension is free


class QuantizeError(PrismError):
    """Calibration data, a profile or a quantization option that cannot be used."""


@dataclass(frozen=True)
class Samples:
    """Calibration samples: input name -> array with the samples along axis 0."""

    arrays: dict[str, np.ndarray]
    batch: int  # samples per run
    source: str = "samples"
    fixed: bool = False  # the model's batch dimension is fixed at `batch`
    axes: dict[str, int] = field(default_factory=dict)  # where an input's samples lie in a
    # run, where not on its first axis (`arrays` holds them first)

    @property
    def count(self) -> int:
        return next((len(v) for v in self.arrays.values() if v.ndim), 1)

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.count, self.batch):
            yield {k: np.moveaxis(v, 0, self.axes[k]) if k in self.axes else v
                   for k, v in self._rows(slice(start, start + self.batch)).items()}

    def _rows(self, rows: slice) -> dict[str, np.ndarray]:
        """Those samples of every input (a scalar input whole: it is every run's)."""
        return {k: v[rows] if v.ndim else v for k, v in self.arrays.items()}

    def runs(self) -> int:
        return -(-self.count // self.batch)

    def even(self) -> Samples:
        """The same samples in runs of one size (histogram calibrators stack runs)."""
        size = next(d for d in range(min(self.batch, self.count), 0, -1) if self.count % d == 0)
        return replace(self, batch=size)

    def split(self, holdout: float) -> tuple[Samples, Samples]:
        """(calibration, held-out): the last `holdout` share of the samples is held out."""
        unit = self.batch if self.fixed else 1
        keep = self.count - max(unit, round(self.count * holdout / unit) * unit)
        if keep < unit:
            raise QuantizeError(f"{self.source}: {self.count} samples are too few to hold out "
                                f"{holdout:.0%} and still calibrate; give more samples")
        return (replace(self, arrays=self._rows(slice(None, keep))),
                replace(self, arrays=self._rows(slice(keep, None))))


def _describe(dims) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def check_samples(arrays: dict[str, np.ndarray], graph: Graph, source: str) -> Samples:
    """Samples for `graph`, or a QuantizeError naming what does not match."""
    specs = {s.name: s for s in input_specs(graph)}
    where = f"{source}: "
    missing = [n for n in specs if n not in arrays]
    if missing:
        raise QuantizeError(f"{where}no array for input {missing[0]!r} of {graph.name} (the "
                            f"file has {', '.join(sorted(arrays)) or 'nothing'})")
    extra = sorted(set(arrays) - set(specs))
    if extra:
        raise QuantizeError(f"{where}array {extra[0]!r} is not an input of {graph.name} "
                            f"(inputs: {', '.join(specs)})")
    counts = set()
    batch, fixed, axes = DEFAULT_BATCH, False, {}
    firsts = [s.dims[0] for s in specs.values() if s.dims and isinstance(s.dims[0], str)]
    named = max(set(firsts), key=firsts.count) if firsts else None  # the batch's name
    for name, spec in specs.items():
        value = arrays[name] = as_text(graph.name, spec, arrays[name])
        if spec.type is not None or spec.dims is None or spec.dtype is None:
            raise QuantizeError(f"{where}input {name!r} of {graph.name} is "
                                f"{spec.describe()}; calibration takes tensors of known shape")
        if value.dtype != spec.dtype:
            raise QuantizeError(f"{where}input {name!r} is {value.dtype}; {graph.name} takes "
                                f"{spec.dtype}")
        dims = spec.dims
        if dims and named is not None and named in dims[1:] and dims[0] != named:
            axes[name] = dims.index(named)
            dims = (named, *dims[:axes[name]], *dims[axes[name] + 1:])
            value = arrays[name] = np.moveaxis(value, axes[name], 0)
        if not dims:
            if value.ndim:
                raise QuantizeError(f"{where}input {name!r} has shape {tuple(value.shape)}; "
                                    f"{graph.name} takes a scalar: give one value, the same "
                                    f"for every run")
            continue
        wrong = value.ndim != len(dims) or any(
            isinstance(d, int) and d != s for d, s in zip(dims[1:], value.shape[1:],
                                                          strict=False))
        if wrong:
            raise QuantizeError(f"{where}input {name!r} has shape {_shape(value, name, axes)}"
                                f"; {graph.name} takes {_describe(spec.dims)} (samples along "
                                f"the {'batch' if name in axes else 'first'} axis)")
        if isinstance(dims[0], int):
            if value.shape[0] % dims[0]:
                raise QuantizeError(f"{where}input {name!r} has {value.shape[0]} rows; "
                                    f"{graph.name} takes them {dims[0]} at a time")
            batch, fixed = dims[0], True
        counts.add(value.shape[0])
    if len(counts) > 1 or (counts and not min(counts)):
        counted = ", ".join(f"{k}: {len(arrays[k])}" for k, s in specs.items() if s.dims)
        raise QuantizeError(f"{where}inputs have different or no sample counts ({counted})")
    return Samples({n: arrays[n] for n in specs}, batch, source, fixed, axes)


def _shape(value: np.ndarray, name: str, axes: dict[str, int]) -> tuple[int, ...]:
    """The shape the file gave, its samples' axis where the file had it."""
    return tuple(np.moveaxis(value, 0, axes[name]).shape if name in axes else value.shape)


def read_samples(path: str | Path, graph: Graph) -> Samples:
    arrays = read_npz(path, "calibration data", QuantizeError)
    return check_samples(arrays, graph, str(path))
