"""Tensors a device in another process hands back without sending them to the host.

A `ray` device answers a run with `RemoteValue`s (Ray object references): the next `ray`
device reads them straight from Ray's object store. The executor calls `local` only
where a tensor must be in this process: feeds for a device that does not take remote
values (`Device.takes_remote`), and the request's outputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any


class RemoteValue(ABC):
    """A tensor in another process, with the dtype and shape its device reported (None
    for a value that is not a tensor), so the executor checks it without fetching it."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: Any, shape: tuple[int, ...] | None):
        self.dtype, self.shape = dtype, shape

    @abstractmethod
    def fetch(self) -> Any:
        """The value, brought to this process (bounded wait; ExecutionError if lost)."""


def local(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every RemoteValue fetched."""
    return {name: v.fetch() if isinstance(v, RemoteValue) else v for name, v in values.items()}
