"""The runtime's shared vocabulary, after Glow's RuntimeTypes.h: the records, callbacks
and aliases that more than one room uses, one name per idea. A leaf (numpy and the errors
only), so any room may import it. A record that belongs to one room lives there with its
callback type (a request and `RequestDone`: `runtime.executor.requests`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import ExecutionError, PrismError

Outputs = dict[str, np.ndarray]  # tensors by name, as a run returns them
Tag = dict[str, Any]  # the fields a run's events carry (network, request, partition)
RunDone = Callable[[Outputs | None, ExecutionError | None], None]  # a device run ended


class OutsizedFeeds(dict):
    """A request's feeds whose activations far outgrow what its network's requests
    usually need (`RequestMemory.admit`). Each device run of it gives back, as it ends,
    the memory onnxruntime's arena grew by for it (which the arena would otherwise keep
    for good: the tiny wav2vec2 held 3.0 GB after one 3.75-second clip, 159 MB loaded). The
    type is the mark, so other feeds pay one type check for it."""

    __slots__ = ()


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 8
    max_queue_delay_ms: float = 1.0
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_delay_ms < 0:
            raise PrismError(f"batching needs max_batch_size >= 1 and max_queue_delay_ms >= "
                             f"0, got {self.max_batch_size} and {self.max_queue_delay_ms}")
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(
            {int(s) for s in self.preferred_batch_sizes if 0 < int(s) <= self.max_batch_size})))

    @classmethod
    def of(cls, value: BatchingConfig | Mapping | None) -> BatchingConfig | None:
        if value is None or isinstance(value, BatchingConfig):
            return value
        unknown = set(value) - {"max_batch_size", "max_queue_delay_ms", "preferred_batch_sizes"}
        if unknown:
            raise PrismError(f"batching: unknown setting(s) {sorted(unknown)}")
        return cls(**value)


def check_batchable(network: str, inputs: Mapping[str, Sequence | None],
                    outputs: Mapping[str, Sequence | None]) -> None:
    """Every input and output (name -> declared dims, None when unknown) must have a
    symbolic first dimension, or batching is refused."""
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for name, dims in tensors.items():
            if not dims or isinstance(dims[0], int):
                first = "no shape" if not dims else f"a fixed first dimension {dims[0]}"
                raise PrismError(f"{network} cannot batch: {kind} {name!r} has {first}; "
                                 f"dynamic batching needs a symbolic batch dimension")
