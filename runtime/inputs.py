"""What a network expects as feeds: checking given feeds, and drawing random ones."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime.errors import InvalidInputError
from runtime.graph import Dim, Graph


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype | None
    dims: tuple[Dim, ...] | None

    def describe(self) -> str:
        dims = "?" if self.dims is None else ", ".join(
            str(d) if d is not None else "?" for d in self.dims)
        return f"{self.dtype or '?'} [{dims}]"


def input_specs(graph: Graph) -> list[InputSpec]:
    specs = []
    for name in graph.inputs:
        info = graph.tensors.get(name)
        dtype = np.dtype(info.dtype) if info and info.dtype else None
        specs.append(InputSpec(name, dtype, info.dims if info else None))
    return specs


def _shape_ok(dims: tuple[Dim, ...] | None, shape: tuple[int, ...]) -> bool:
    if dims is None:
        return True
    return len(dims) == len(shape) and all(
        not isinstance(d, int) or d == s for d, s in zip(dims, shape, strict=True))


def check_feeds(network: str, specs: list[InputSpec], feeds: Mapping[str, object]
                ) -> dict[str, np.ndarray]:
    """Feeds as arrays, or InvalidInputError naming the input, expected vs given."""
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise InvalidInputError(f"feeds for {network} must be a dict of input name -> array, "
                                f"got {type(feeds).__name__}")
    out = {}
    for spec in specs:
        value = feeds.get(spec.name)
        if value is None:
            known = {s.name for s in specs}
            extra = [k for k in feeds if k not in known]
            if extra:
                raise InvalidInputError(f"{network} has no input {extra[0]!r}; inputs are "
                                        f"{', '.join(map(repr, sorted(known)))}")
            raise InvalidInputError(f"input {spec.name!r} of {network} is missing: expected "
                                    f"{spec.describe()}")
        array = value if type(value) is np.ndarray else np.asarray(value)
        if (spec.dtype is not None and array.dtype != spec.dtype) or not _shape_ok(
                spec.dims, array.shape):
            raise InvalidInputError(
                f"input {spec.name!r} of {network}: expected {spec.describe()}, got "
                f"{array.dtype} [{', '.join(map(str, array.shape))}]")
        out[spec.name] = array
    if len(feeds) != len(out):
        extra = sorted(k for k in feeds if k not in out)
        raise InvalidInputError(f"{network} has no input {extra[0]!r}; inputs are "
                                f"{', '.join(map(repr, sorted(out)))}")
    return out


def random_feeds(specs: list[InputSpec], rng: np.random.Generator,
                 bindings: Mapping[str, int] | None = None, default_dim: int = 1
                 ) -> dict[str, np.ndarray]:
    """Random feeds of the right dtype and shape; symbolic dims from `bindings` or 1."""
    bindings = bindings or {}
    feeds = {}
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else int(bindings.get(d, default_dim))
                      for d in (spec.dims or ()))
        dtype = spec.dtype or np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = _integers(spec.name.lower(), shape, dtype, rng)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            feeds[spec.name] = np.full(shape, "x", dtype=object) if dtype.kind in "OUS" else \
                np.zeros(shape, dtype)
    return feeds


def _integers(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
              ) -> np.ndarray:
    """Integer inputs as text models expect them: masks of ones, segment ids of zero,
    positions counting up, anything else (token ids) small non-negative numbers."""
    if "mask" in name:
        return np.ones(shape, dtype)
    if "type" in name or "segment" in name:
        return np.zeros(shape, dtype)
    if "position" in name and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    return rng.integers(0, 16, shape).astype(dtype)
