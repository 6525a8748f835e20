"""What one request's activations need at the sizes it comes with, so that a request past
the machine's memory is refused in one line before it runs, and the process serving every
other request is not killed for want of memory: wav2vec2 given 100,000 samples of audio
held 7.6 GB, its attention growing with their square. One that may run but needs far
more than the network's requests usually do is marked outsized, so that its runs give
back the memory they took (`runtime.types.OutsizedFeeds`).

    memory = request_memory(graph, parts)       # runtime/partition/liveness.py; None:
                                                # no size a request may choose
    memory.admit(network, {input: shape})       # InvalidInputError past the machine;
                                                # True: outsized (`OutsizedFeeds`)
    memory = RequestMemory.from_dict(memory.to_dict())   # as a bundle keeps it

Each activation's dims as inference left them (`Tensor.dims`: the inputs' named sizes and
expressions of them, as `((n//10)) - 1`) are computed at the request's sizes; a dim naming
anything else keeps its size at load. Their bytes, live over each partition's node order
as the memory plan counts them (`live_intervals`, `held_bytes`), peak at what each needs;
the sum is the request's. onnxruntime holds more than that (wav2vec2 at 100,000 samples,
alone: 4.0 GB where its activations peak at 2.2 GB), so a request refused could not have
run, and one near the machine's memory may still meet the kernel's OOM killer.
"""

from __future__ import annotations

import ast
import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import numpy as np

from runtime.errors import InvalidInputError
from runtime.inputs import shapes_text
from runtime.machine import machine_bytes, memory_text
from runtime.units import human_bytes

Dim = int | CodeType  # a size, or an expression of the inputs' named sizes
_ARITHMETIC = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Constant,
               ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub)
_VERDICTS_KEPT = 4096  # request sizes whose need is remembered
# A request is outsized (`OutsizedFeeds`) needing this many times a usual one's bytes, and
# this many bytes more (less is not worth the allocations a run giving its arena back
# makes again: 1.29 s against 1.11 s for that wav2vec2 clip, docs/performance.md)
OUTSIZED_TIMES = 4
OUTSIZED_BYTES = 256 << 20
OUTSIZED_REPEATS = 2  # sizes judged outsized this many times are usual from then on


def compiled_dim(dim: object, bound: int, named: Mapping[str, object]) -> Dim:
    """`dim` compiled where it is arithmetic on the inputs' named sizes, else `bound`."""
    if not isinstance(dim, str):
        return bound
    try:
        tree = ast.parse(dim, mode="eval")
    except SyntaxError:
        return bound
    if all(isinstance(n, _ARITHMETIC) and (not isinstance(n, ast.Name) or n.id in named)
           and (not isinstance(n, ast.Constant) or type(n.value) is int)
           for n in ast.walk(tree)):
        return compile(tree, dim, "eval")
    return bound


def live_bytes(spans: Sequence[tuple[int, int]] | np.ndarray, sizes: Sequence[float] | np.ndarray,
               steps: int) -> np.ndarray:
    """The bytes live at each of `steps` steps, each of `sizes` held from the first to the
    last step of its span (the plan's peaks and each device's memory plan count so too)."""
    held = np.asarray(sizes)
    live = np.zeros(steps + 1, dtype=held.dtype if held.size else np.int64)
    at = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    np.add.at(live, at[:, 0], held)
    np.add.at(live, at[:, 1] + 1, -held)
    return np.cumsum(live[:steps])


@dataclass(frozen=True, eq=False)
class RequestMemory:
    """The activations of one network: per tensor its dims, its bytes per element and the
    steps it is alive, in the order its partition runs its nodes; `limit`: the bytes a
    request may need (the machine's memory)."""

    axes: Mapping[str, tuple[str, int]]  # named size -> (input, axis)
    bound: Mapping[str, int]  # named size -> its size at load (an input left out keeps it)
    names: tuple[str, ...]
    dims: tuple[tuple[Dim, ...], ...]
    shapes: tuple[tuple[int, ...], ...]  # at load: where its dims cannot be computed
    itemsizes: np.ndarray
    spans: np.ndarray  # (first, last) step alive, partitions' steps one after another
    parts: tuple[tuple[int, int], ...]  # each partition's first step and the one after it
    limit: int
    verdicts: dict[tuple[int, ...], float] = field(default_factory=dict)  # sizes -> bytes
    needs: list[float] = field(default_factory=list)  # the verdicts' bytes, sorted
    outsized: dict[tuple[int, ...], int] = field(default_factory=dict)  # sizes -> times

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], limit: int | None = None
                  ) -> RequestMemory | None:
        """As `to_dict` wrote it (a bundle's `request_memory.json`); `limit`: default the
        machine's memory here. None where the machine does not say its memory."""
        limit = limit or machine_bytes()
        if limit is None:
            return None
        axes = {d: (name, int(axis)) for d, (name, axis) in data["axes"].items()}
        shapes = tuple(tuple(int(d) for d in shape) for shape in data["shapes"])
        return cls(axes, {d: int(n) for d, n in data["bound"].items()}, tuple(data["names"]),
                   tuple(tuple(compiled_dim(d, b, axes) for d, b in zip(dims, shape, strict=True))
                         for dims, shape in zip(data["dims"], shapes, strict=True)),
                   shapes, np.array(data["itemsizes"], dtype=np.float64),
                   np.array(data["spans"], dtype=np.int64).reshape(-1, 2),
                   tuple((int(a), int(b)) for a, b in data["parts"]), limit)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each dim a size or its expression's text (`limit` left out: the
        machine that reads it says its own)."""
        return {"axes": {d: list(at) for d, at in self.axes.items()}, "bound": dict(self.bound),
                "names": list(self.names),
                "dims": [[d if isinstance(d, int) else d.co_filename for d in dims]
                         for dims in self.dims],
                "shapes": [list(shape) for shape in self.shapes],
                "itemsizes": self.itemsizes.tolist(), "spans": self.spans.tolist(),
                "parts": [list(part) for part in self.parts]}

    def sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The named sizes a request's shapes give (those it leaves out, their size at
        load)."""
        return {**self.bound, **{d: shapes[name][axis] for d, (name, axis) in self.axes.items()
                                 if name in shapes and axis < len(shapes[name])}}

    def tensor_bytes(self, sizes: Mapping[str, int]) -> np.ndarray:
        """Each tensor's bytes at those sizes."""
        named: dict[str, object] = {"__builtins__": {}}  # arithmetic alone: `compiled_dim`
        counts: dict[tuple[Dim, ...], float] = {}  # many tensors share one shape
        for dims, shape in zip(self.dims, self.shapes, strict=True):
            if dims not in counts:
                try:
                    counts[dims] = math.prod(max(d if isinstance(d, int) else
                                                 eval(d, named, sizes), 0) for d in dims)
                except ArithmeticError:  # a size dividing by one that is 0 here
                    counts[dims] = math.prod(shape)
        return np.array([counts[d] for d in self.dims], dtype=np.float64) * self.itemsizes

    def needed(self, sizes: Mapping[str, int]) -> float:
        """The bytes the activations hold at those sizes: each partition's peak, summed
        (each session keeps the memory its peak took, as onnxruntime's arena does)."""
        live = live_bytes(self.spans, self.tensor_bytes(sizes), self.parts[-1][1])
        return float(sum(live[a:b].max(initial=0.0) for a, b in self.parts))

    def _need(self, key: tuple[int, ...], sizes: Mapping[str, int]) -> float:
        """`needed`, remembered for sizes seen before (up to _VERDICTS_KEPT of them)."""
        need = self.verdicts.get(key)
        if need is None:
            need = self.needed(sizes)
            if len(self.verdicts) < _VERDICTS_KEPT:
                self.verdicts[key] = need
                if need <= self.limit:  # a usual request is one that runs
                    bisect.insort(self.needs, need)
        return need

    def _usual(self, own: float) -> float:
        """The lower median of `needs`, its entry equal to `own` left out (if it has one)."""
        needs, at = self.needs, bisect.bisect_left(self.needs, own)
        if at < len(needs) and needs[at] == own:
            needs = needs[:at] + needs[at + 1:]
        return needs[(len(needs) - 1) // 2] if needs else own

    def admit(self, network: str, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """InvalidInputError where a request of these shapes needs more than `limit`; else
        whether it is outsized: it needs OUTSIZED_TIMES a usual request's bytes and
        OUTSIZED_BYTES more. A usual request's need is the lower median over the other
        distinct sizes admitted (those at load among them): one long clip among short ones
        does not move it, and a size grows usual as others near it come, or as it comes
        again (a fixed padded shape keeps its arena). A request's need is worked out once
        for its sizes."""
        if not self.needs:
            self._need(tuple(self.bound.values()), self.bound)
        sizes = self.sizes(shapes)
        key = tuple(sizes.values())
        need = self._need(key, sizes)
        if need <= self.limit:
            usual = self._usual(need)
            if need <= OUTSIZED_TIMES * usual or need - usual <= OUTSIZED_BYTES:
                return False
            times = self.outsized.get(key, 0) + 1
            if times < OUTSIZED_REPEATS and len(self.outsized) < _VERDICTS_KEPT:
                self.outsized[key] = times
            return times < OUTSIZED_REPEATS
        held = self.tensor_bytes(sizes)
        largest = int(held.argmax())
        raise InvalidInputError(
            f"a request to {network} at {shapes_text(shapes)} needs about "
            f"{human_bytes(int(need))} of activations ({self.names[largest]} alone "
            f"{human_bytes(int(held[largest]))}); {memory_text(self.limit)}")
